#!/usr/bin/env bash
# Debian's Chromium and ChromeDriver, and axe-core (the accessibility engine
# of Lighthouse and axe DevTools, pinned below), for the console's browser
# tests (tests/e2e/console): prints chromedriver's path, chromium's and
# axe.min.js's (a line each on stdout; progress on stderr). The first time it
# installs the two Debian packages (apt-get) and axe-core from the npm
# registry into target/axe; one installer at a time, as tests run in
# parallel.
set -euo pipefail
cd "$(dirname "$0")/.."

AXE_VERSION=4.14.1
axe=$PWD/target/axe/node_modules/axe-core/axe.min.js

say() { printf 'browser.sh: %s\n' "$*" >&2; }
provided() { [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver && -s $axe ]] && grep -q "axe v$AXE_VERSION" "$axe"; }

if ! provided; then
  exec 9>/tmp/ops-console-browser.lock
  flock 9
  if ! [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
    say "no chromium and chromedriver; installing Debian's chromium and chromium-driver"
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y -qq chromium chromium-driver >&2 || {
      $sudo apt-get update -qq >&2
      $sudo apt-get install -y -qq chromium chromium-driver >&2
    }
  fi
  if ! provided; then
    say "installing axe-core $AXE_VERSION from the npm registry into target/axe"
    command -v npm >/dev/null || { say "no npm (Debian: apt-get install npm)"; exit 1; }
    mkdir -p target/axe
    npm install --silent --no-audit --no-fund --prefix target/axe "axe-core@$AXE_VERSION" >&2
  fi
fi
provided || { say "chromium, chromedriver or axe-core $AXE_VERSION is still missing"; exit 1; }
echo /usr/bin/chromedriver
echo /usr/bin/chromium
echo "$axe"
