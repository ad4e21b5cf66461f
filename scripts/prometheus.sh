#!/usr/bin/env bash
# Prints the folder holding `prometheus` and `promtool` (one line on stdout),
# for scripts/deploy-check.sh (promtool test rules) and tests/e2e/prometheus.
# The first time, both are extracted from Debian's `prometheus` package
# (apt-get download, never installed: that would start a server on port
# 9090) into target/prometheus, or PROMETHEUS_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'prometheus.sh: %s\n' "$*" >&2; }

dir=${PROMETHEUS_DIR:-target/prometheus}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
provided() { [[ -x $dir/prometheus && -x $dir/promtool ]]; }

if ! provided; then
  # One extraction at a time (tests run in parallel); a half-copied binary is never run.
  exec 9>"$dir/.lock"
  flock 9
fi
if ! provided; then
  if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    say "no apt-get/dpkg-deb to fetch Debian's prometheus package: put prometheus and promtool in $dir"
    exit 2
  fi
  say "extracting prometheus and promtool from Debian's prometheus package into $dir"
  debs=$(mktemp -d)
  trap 'rm -rf "$debs"' EXIT
  chmod 755 "$debs" # apt's download user must be able to write there
  if ! (cd "$debs" && apt-get download -qq prometheus >/dev/null 2>&1); then
    if [ "$(id -u)" = 0 ]; then apt-get update -qq >&2; else sudo apt-get update -qq >&2; fi
    (cd "$debs" && apt-get download -qq prometheus >&2)
  fi
  dpkg-deb -x "$debs"/prometheus_*.deb "$debs/root"
  for tool in prometheus promtool; do
    install -m 755 "$debs/root/usr/bin/$tool" "$dir/.$tool.new"
    mv -f "$dir/.$tool.new" "$dir/$tool"
  done
fi
echo "$dir"
