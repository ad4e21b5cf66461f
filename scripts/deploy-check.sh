#!/usr/bin/env bash
# `make deploy-check`: validates the Kubernetes manifests under deploy/ offline
# and checks them against the code (scripts/deploy_check.py says what exactly).
#
# Needs python3 (with venv) and, the first time, PyPI: the pinned validator is
# installed into target/deploy-check-venv and reused while
# scripts/deploy-check-requirements.txt is unchanged.
#
# Environment:
#   DEPLOY_CHECK_BINDIR=DIR                 where the binaries are (default target/debug)
#   DEPLOY_CHECK_ALLOW_MISSING_BINARIES=1   a binary not built yet is a SKIP, not a FAIL
#   DEPLOY_CHECK_VENV=DIR                   another place for the venv
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${DEPLOY_CHECK_VENV:-target/deploy-check-venv}
requirements=scripts/deploy-check-requirements.txt
stamp=$venv/.requirements.sha256
want=$(sha256sum "$requirements" | cut -d' ' -f1)

if [[ ! -x $venv/bin/python || ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "deploy-check: installing the validator into $venv" >&2
  rm -rf "$venv"
  if ! python3 -m venv "$venv"; then
    echo "deploy-check: 'python3 -m venv' failed (on Debian: apt-get install python3-venv)" >&2
    exit 2
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$requirements"
  echo "$want" >"$stamp"
fi

exec "$venv/bin/python" scripts/deploy_check.py "$@"
