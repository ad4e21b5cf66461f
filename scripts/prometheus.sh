#!/usr/bin/env bash
# A real Prometheus for the checks and tests that need one: prints the
# folder holding `prometheus` and `promtool` (one line on stdout; progress on
# stderr), providing them the first time.
#
#   "$(scripts/prometheus.sh)/promtool" test rules ...   # scripts/deploy_check
#   "$(scripts/prometheus.sh)/prometheus" --config.file=...   # tests/e2e/prometheus.rs
#
# Both come from Debian's `prometheus` package, downloaded (apt-get download)
# and extracted into target/prometheus/, never installed: installing it would
# start a Prometheus server on port 9090 as a system service. Debian 12's is
# Prometheus 2.42. The folder is reused while both binaries are there.
#
# Environment:
#   PROMETHEUS_DIR=DIR   another folder (default target/prometheus)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'prometheus.sh: %s\n' "$*" >&2; }

dir=${PROMETHEUS_DIR:-target/prometheus}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

provided() { [[ -x $dir/prometheus && -x $dir/promtool ]]; }

if ! provided; then
  # One extraction at a time: tests run in parallel, and a half-copied
  # binary must never be run.
  exec 9>"$dir/.lock"
  flock 9
  if ! provided; then
    if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
      say "no apt-get/dpkg-deb to fetch Debian's prometheus package: put prometheus and promtool in $dir"
      exit 2
    fi
    say "extracting prometheus and promtool from Debian's prometheus package into $dir"
    sudo=""
    [[ $(id -u) == 0 ]] || sudo="sudo"
    debs=$(mktemp -d)
    trap 'rm -rf "$debs"' EXIT
    chmod 755 "$debs" # apt's download user must be able to write there
    if ! (cd "$debs" && apt-get download -qq prometheus >/dev/null 2>&1); then
      $sudo apt-get update -qq >&2
      (cd "$debs" && apt-get download -qq prometheus >&2)
    fi
    dpkg-deb -x "$debs"/prometheus_*.deb "$debs/root"
    for tool in prometheus promtool; do
      install -m 755 "$debs/root/usr/bin/$tool" "$dir/.$tool.new"
      mv -f "$dir/.$tool.new" "$dir/$tool"
    done
  fi
fi
echo "$dir"
