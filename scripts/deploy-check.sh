#!/usr/bin/env bash
# `make deploy-check`: the manifests under deploy/ rendered, validated and checked
# against the code, offline (scripts/deploy_check/). Needs the binaries (make build,
# or DEPLOY_CHECK_BINDIR); provides the venv and kubectl (scripts/deploy-venv.sh) and
# promtool (DEPLOY_CHECK_PROMTOOL, the machine's, else scripts/prometheus.sh's).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/deploy-venv.sh
source scripts/deploy-venv.sh
if [[ -z ${DEPLOY_CHECK_PROMTOOL:-} ]] && ! DEPLOY_CHECK_PROMTOOL=$(command -v promtool); then
  DEPLOY_CHECK_PROMTOOL=$(scripts/prometheus.sh)/promtool
fi
export DEPLOY_CHECK_PROMTOOL
PYTHONPATH=scripts${PYTHONPATH:+:$PYTHONPATH} exec "$venv/bin/python" -m deploy_check "$@"
