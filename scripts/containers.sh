# Sourced by scripts/images.sh and scripts/deploy-smoke.sh. need_podman returns once
# podman works (installed from Debian's packages the first time, configured by
# containers/containers.conf). Where it cannot be had it exits: 0 with
# CONTAINERS_OPTIONAL=1 and CI unset (`make test` on a developer's machine), else 2.

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
  # runc: see containers.conf; slirp4netns: the smoke's pods reach the host's loopback by it.
  local packages=(podman buildah runc containernetworking-plugins slirp4netns) sudo=() out
  if ! hash podman buildah runc slirp4netns 2>/dev/null; then
    ((EUID == 0)) || sudo=(sudo -n)
    containers_say "installing ${packages[*]} (Debian's packages, once)"
    "${sudo[@]}" apt-get update -qq >/dev/null 2>&1 || true
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" \
      >/dev/null || containers_unavailable "no podman, and apt-get (as root or sudo -n) failed"
  fi
  out=$(podman info --format '{{.Host.OCIRuntime.Name}}' 2>&1) \
    || containers_unavailable "podman does not work here: $out"
}
