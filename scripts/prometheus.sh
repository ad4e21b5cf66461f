#!/usr/bin/env bash
# Prints the folder holding `prometheus` and `promtool`, for deploy-check.sh and
# tests/e2e/prometheus: target/prometheus (or PROMETHEUS_DIR), where the first run extracts
# them from Debian's package (never installed: that would start a server on port 9090).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'prometheus.sh: %s\n' "$*" >&2; }
# shellcheck source=scripts/cluster-common.sh
. scripts/cluster-common.sh

dir=${PROMETHEUS_DIR:-target/prometheus}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# One extraction at a time (tests run in parallel); a half-copied binary is never run.
exec 9>"$dir/.lock"
flock 9
if [[ ! -x $dir/prometheus || ! -x $dir/promtool ]]; then
  say "extracting prometheus and promtool from Debian's prometheus package into $dir"
  debs=$(mktemp -d)
  trap 'rm -rf "$debs"' EXIT
  chmod 755 "$debs" # apt's download user must be able to write there
  cd "$debs"
  if ! apt-get download -qq prometheus >/dev/null 2>&1; then
    as_root apt-get update -qq >&2
    apt-get download -qq prometheus >&2
  fi
  dpkg-deb -x prometheus_*.deb root
  for tool in prometheus promtool; do
    install -m 755 "root/usr/bin/$tool" "$dir/.$tool.new"
    mv -f "$dir/.$tool.new" "$dir/$tool"
  done
fi
echo "$dir"
