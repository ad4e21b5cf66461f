# Sourced by scripts/images.sh and scripts/deploy-smoke.sh. need_podman
# returns once podman works, installed from Debian's packages the first time
# (about 20 s), with scripts/containers/containers.conf as CONTAINERS_CONF.
# Where it cannot be installed (apt-get, as root or with sudo -n): with
# CONTAINERS_OPTIONAL=1 and CI unset it says so and exits 0 (`make test` on a
# developer's machine skips the images and their smoke); else it exits 2.

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
  # runc: see containers.conf; slirp4netns: the smoke's pods reach the host's loopback through it.
  local packages=(podman buildah runc containernetworking-plugins slirp4netns) sudo=() missing out
  missing=$(for p in podman buildah runc slirp4netns; do command -v "$p" >/dev/null || printf '%s ' "$p"; done)
  if [[ -n $missing ]]; then
    ((EUID == 0)) || sudo=(sudo -n)
    containers_say "installing ${packages[*]} (Debian packages; once)"
    # The package lists may be missing or stale on a fresh machine.
    local install=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}")
    if ! "${install[@]}" >/dev/null 2>&1; then
      "${sudo[@]}" apt-get update -qq >/dev/null 2>&1 || true
      "${install[@]}" >/dev/null || containers_unavailable \
        "no ${missing% }, and apt-get could not install them (root, or sudo with no password, and Debian's packages)"
    fi
  fi
  out=$(podman info --format '{{.Host.OCIRuntime.Name}}' 2>&1) \
    || containers_unavailable "podman does not work here: $out"
}
