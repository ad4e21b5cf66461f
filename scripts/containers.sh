# Sourced by scripts/images.sh and scripts/deploy-smoke.sh: podman and buildah
# ready to use, installed from Debian's packages the first time (about 20 s),
# with scripts/containers/containers.conf as CONTAINERS_CONF.
#
# need_podman: returns once podman works. Without podman and no way to install
# it (no apt, no root or sudo, no mirror): with CONTAINERS_OPTIONAL=1 and CI
# unset, prints why and exits 0 (`make test` on a developer's machine skips
# the images and their smoke); else exits 2.

# The packages: podman and buildah, runc (see containers.conf), the network
# plugins and slirp4netns (the smoke's containers reach the host's loopback
# through it).
CONTAINER_PACKAGES=(podman buildah runc containernetworking-plugins slirp4netns)

CONTAINERS_CONF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)/containers/containers.conf
export CONTAINERS_CONF

containers_say() { printf '%s: %s\n' "${containers_who:-containers}" "$*" >&2; }

containers_unavailable() {
  if [[ ${CONTAINERS_OPTIONAL:-0} = 1 && -z ${CI:-} ]]; then
    containers_say "SKIPPED: $* (CI=true makes this an error; install podman to run it)"
    exit 0
  fi
  containers_say "$*"
  exit 2
}

need_podman() {
  local missing=() p sudo="" shown out
  for p in podman buildah runc slirp4netns; do command -v "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if ((${#missing[@]})); then
    shown=$(printf '%s, ' "${missing[@]}")
    shown=${shown%, }
    command -v apt-get >/dev/null 2>&1 || containers_unavailable "no $shown, and no apt-get to install them"
    if [[ $(id -u) != 0 ]]; then
      sudo -n true 2>/dev/null || containers_unavailable "no $shown, and installing them needs root (or sudo without a password)"
      sudo=sudo
    fi
    containers_say "installing ${CONTAINER_PACKAGES[*]} (Debian packages; once)"
    export DEBIAN_FRONTEND=noninteractive
    # The package lists may be missing or stale on a fresh machine.
    if ! $sudo apt-get install -y -qq "${CONTAINER_PACKAGES[@]}" >/dev/null 2>&1; then
      $sudo apt-get update -qq >/dev/null 2>&1 || true
      $sudo apt-get install -y -qq "${CONTAINER_PACKAGES[@]}" >/dev/null \
        || containers_unavailable "could not install ${CONTAINER_PACKAGES[*]} with apt-get"
    fi
  fi
  out=$(podman info --format '{{.Host.OCIRuntime.Name}}' 2>&1) || containers_unavailable "podman does not work here: $out"
}
