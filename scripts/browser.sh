#!/usr/bin/env bash
# For tests/e2e/console: prints the paths of chromedriver, chromium and axe.min.js,
# installing the first time Debian's chromium and chromium-driver, and axe-core (the
# accessibility engine of Lighthouse and axe DevTools, pinned) from npm into target/axe.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'browser.sh: %s\n' "$*" >&2; }
# shellcheck source=scripts/cluster-common.sh
. scripts/cluster-common.sh

AXE_VERSION=4.14.1
axe=$PWD/target/axe/node_modules/axe-core/axe.min.js
browser() { [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; }
provided() { browser && [[ -s $axe ]] && grep -q "axe v$AXE_VERSION" "$axe"; }

if ! provided; then
  # One installer at a time: tests run in parallel.
  exec 9>/tmp/ops-console-browser.lock
  flock 9
  browser || apt_install chromium chromium-driver
  if ! provided && command -v npm >/dev/null; then
    say "installing axe-core $AXE_VERSION from the npm registry into target/axe"
    npm install --silent --no-audit --no-fund --prefix target/axe "axe-core@$AXE_VERSION" >&2
  fi
fi
provided || refuse "chromium, chromedriver or axe-core $AXE_VERSION (from npm) is still missing"
printf '%s\n' /usr/bin/chromedriver /usr/bin/chromium "$axe"
