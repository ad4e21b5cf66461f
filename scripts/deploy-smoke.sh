#!/usr/bin/env bash
# `make deploy-smoke`: the rendered dev overlay run by `podman kube play` on
# the images scripts/images.sh builds, with the checks that tie the manifests
# to the binaries and a named shim for what podman 4.3 cannot do
# (scripts/deploy_smoke/__init__.py lists both). Exit 0 if it passed.
#
# What it provides:
# - podman and buildah (Debian's packages, installed the first time;
#   scripts/containers.sh, with the containers.conf that machines like CI's
#   need), and the images, built from the host's binaries;
# - kubectl and PyYAML: the venv of make deploy-check (scripts/deploy-venv.sh);
# - its own throwaway Postgres: scripts/pg-cluster.sh with a folder and a port
#   of its own (/tmp/webhook-pg-<key>, keyed by the checkout's path and
#   "deploy-smoke"), since it stops and restarts the server under the pods.
#   DATABASE_URL is not used for that reason. Stopped at the end;
# - the simulated provider and downstream: crates/simulator, built with the
#   binaries in the images (target/release, or target/debug).
# The pods reach the host's loopback (the Postgres, the downstream) at
# 10.0.2.2 through slirp4netns; each has a network namespace of its own, so
# the ports are the manifests'.
#
# Environment:
#   IMAGES_PROFILE=release       release | debug (make test uses debug)
#   CONTAINERS_OPTIONAL=1        skip (exit 0) when podman cannot be had and CI is unset
#   DEPLOY_SMOKE_READY_SECS=60   how long a pod may take to become Ready
# Arguments go to the smoke: --break NAME (one broken render, expected to
# fail), --no-breaks, --help.
set -euo pipefail
cd "$(dirname "$0")/.."

containers_who=deploy-smoke
# shellcheck source=scripts/containers.sh
source scripts/containers.sh
need_podman

scripts/images.sh

deploy_venv_who=deploy-smoke
# shellcheck source=scripts/deploy-venv.sh
source scripts/deploy-venv.sh

key=$(printf '%s#deploy-smoke' "$(pwd -P)" | sha1sum | cut -c1-10)
export PG_CLUSTER_DIR=/tmp/webhook-pg-$key
export PG_CLUSTER_PORT=$((20000 + 0x${key:0:4} % 10000))
unset DATABASE_URL

PYTHONPATH=scripts${PYTHONPATH:+:$PYTHONPATH} exec "$venv/bin/python" -m deploy_smoke "$@"
