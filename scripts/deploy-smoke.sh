#!/usr/bin/env bash
# `make deploy-smoke`: the rendered dev overlay played by `podman kube play`
# (scripts/deploy_smoke/) on the images of scripts/images.sh, with podman
# (scripts/containers.sh), kubectl and PyYAML (scripts/deploy-venv.sh) and a
# Postgres of its own, which it stops and starts (scripts/pg-cluster.sh keyed by the checkout).
#
# Environment:
#   IMAGES_PROFILE=release       release | debug (make test): the images' and the simulator's build
#   CONTAINERS_OPTIONAL=1        skip (exit 0) when podman cannot be had and CI is unset
#   DEPLOY_SMOKE_READY_SECS=60   how long a pod may take to become Ready
set -euo pipefail
cd "$(dirname "$0")/.."

containers_who=deploy-smoke
# shellcheck source=scripts/containers.sh
source scripts/containers.sh
# First: where podman cannot be had and that is allowed, images.sh skips, and so must the smoke.
need_podman
scripts/images.sh
deploy_venv_who=deploy-smoke
# shellcheck source=scripts/deploy-venv.sh
source scripts/deploy-venv.sh

# The checkout's key: its Postgres, and the label of the smoke's pods.
key=$(printf '%s#deploy-smoke' "$(pwd -P)" | sha1sum | cut -c1-10)
export DEPLOY_SMOKE_KEY=$key PG_CLUSTER_DIR=/tmp/webhook-pg-$key
export PG_CLUSTER_PORT=$((20000 + 0x${key:0:4} % 10000))
unset DATABASE_URL
PYTHONPATH=scripts${PYTHONPATH:+:$PYTHONPATH} exec "$venv/bin/python" -m deploy_smoke
