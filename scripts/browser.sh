#!/usr/bin/env bash
# Debian's Chromium and ChromeDriver, for the console's browser tests
# (tests/e2e/console): prints chromedriver's path, then chromium's (a line
# each on stdout; progress on stderr), installing the two packages the first
# time (apt-get; one installer at a time, as tests run in parallel).
set -euo pipefail

say() { printf 'browser.sh: %s\n' "$*" >&2; }
provided() { [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; }

if ! provided; then
  exec 9>/tmp/ops-console-browser.lock
  flock 9
  if ! provided; then
    say "no chromium and chromedriver; installing Debian's chromium and chromium-driver"
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y -qq chromium chromium-driver >&2 || {
      $sudo apt-get update -qq >&2
      $sudo apt-get install -y -qq chromium chromium-driver >&2
    }
  fi
fi
provided || { say "chromium or chromedriver is still missing"; exit 1; }
echo /usr/bin/chromedriver
echo /usr/bin/chromium
