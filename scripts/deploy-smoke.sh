#!/usr/bin/env bash
# `make deploy-smoke`: the rendered dev overlay run by `podman kube play` on
# the images scripts/images.sh builds, with the checks that tie the manifests
# to the binaries and a named shim for what podman 4.3 cannot do
# (scripts/deploy_smoke/pods.py). Exit 0 if it passed.
#
# Provides podman (scripts/containers.sh), the images, kubectl and PyYAML
# (make deploy-check's venv, scripts/deploy-venv.sh) and a throwaway Postgres
# of its own: scripts/pg-cluster.sh with a folder and a port keyed by the
# checkout, since the smoke stops and restarts it (so not DATABASE_URL).
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
# Here too: where podman cannot be had and that is allowed, images.sh skips and so must the smoke.
need_podman
scripts/images.sh
deploy_venv_who=deploy-smoke
# shellcheck source=scripts/deploy-venv.sh
source scripts/deploy-venv.sh

# The checkout's key: its Postgres, and the label of the smoke's pods and secrets.
key=$(printf '%s#deploy-smoke' "$(pwd -P)" | sha1sum | cut -c1-10)
export DEPLOY_SMOKE_KEY=$key
export PG_CLUSTER_DIR=/tmp/webhook-pg-$key
export PG_CLUSTER_PORT=$((20000 + 0x${key:0:4} % 10000))
unset DATABASE_URL
PYTHONPATH=scripts${PYTHONPATH:+:$PYTHONPATH} exec "$venv/bin/python" -m deploy_smoke
