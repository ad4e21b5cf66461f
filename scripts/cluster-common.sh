#!/usr/bin/env bash
# Sourced by the cluster scripts, pgbouncer.sh, browser.sh and prometheus.sh (each defines
# `say`): Debian's packages; the servers' unprivileged user, its files and private $base.
# shellcheck shell=bash

refuse() { say "$*"; exit 1; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
  say "installing Debian's $*"
  as_root apt-get update -qq >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

# The folder of the PostgreSQL server binaries, the newest first; empty if none.
find_bindir() {
  local d
  for d in "$(pg_config --bindir 2>/dev/null)" $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V -r) \
    /usr/local/pgsql/bin "$(command -v initdb | xargs -r dirname)"; do
    if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/postgres" ]; then echo "$d"; return; fi
  done
}

# 10 hex digits of the checkout's path: each clone has its own folder and ports.
checkout_key() { printf '%s' "$(cd "$(dirname "$0")/.." && pwd -P)" | sha1sum | cut -c1-10; }

# The servers' user (PostgreSQL and PgBouncer refuse root): the caller, or for
# root `postgres`, else a system user made for the purpose.
pick_user() {
  if [ "$(id -u)" != 0 ]; then pg_user=$(id -un); return; fi
  if id postgres >/dev/null 2>&1; then pg_user=postgres; return; fi
  pg_user=pgcluster
  if ! id "$pg_user" >/dev/null 2>&1; then
    say "creating system user $pg_user to run the cluster"
    useradd --system --no-create-home --shell /usr/sbin/nologin "$pg_user"
  fi
}

run_as() {
  if [ "$(id -u)" != 0 ]; then "$@"; return; fi
  runuser -u "$pg_user" -- "$@"
}

# $base: a directory (not a link), root's or the server user's, writable by no one else.
check_base() {
  local owner mode
  [ ! -L "$base" ] \
    || refuse "refusing $base: it is a symbolic link (remove it; the cluster's folder is never followed through a link)"
  [ -d "$base" ] || refuse "refusing $base: it is not a directory"
  owner=$(stat -c %U -- "$base")
  [ "$owner" = root ] || [ "$owner" = "$pg_user" ] \
    || refuse "refusing $base: it is owned by $owner, not root or $pg_user (someone else made it)"
  mode=$(stat -c %a -- "$base")
  (((8#$mode & 8#022) == 0)) || refuse "refusing $base: it is group- or world-writable (mode $mode)"
}

# Makes $base (mkdir -m 0700 of its last component only), checks it and gives
# it to the server's user. Its parent must be sticky (like /tmp) or writable
# by no one else, so no one can swap it once checked.
make_base() {
  local parent pmode
  parent=$(dirname -- "$base")
  [ -d "$parent" ] || refuse "refusing $base: its parent $parent does not exist"
  pmode=$(stat -L -c %a -- "$parent")
  if (((8#$pmode & 8#022) != 0 && (8#$pmode & 8#1000) == 0)); then
    refuse "refusing $base: its parent $parent is writable by others and not sticky (mode $pmode)"
  fi
  exists || mkdir -m 0700 -- "$base" 2>/dev/null || exists || refuse "could not create $base"
  check_base
  if [ "$(id -u)" = 0 ]; then chown -- "$pg_user" "$base"; fi
  chmod 0700 -- "$base"
}

exists() { [ -e "$base" ] || [ -L "$base" ]; }
existing_base() {
  pick_user
  exists || refuse "no cluster in $base yet: run scripts/$(basename "$0") start"
  check_base
}

# Concurrent callers (parallel test processes) wait for one another; the
# daemons must not inherit descriptor 9 (`9>&-`), or they would hold the lock.
lock_base() { exec 9<"$base"; flock 9; }

# put FILE MODE: stdin into FILE, written by the server's user (never by
# root, so never through a link that user could plant), in one rename.
put() {
  run_as bash -c 'set -euo pipefail; umask 077; rm -f -- "$1.tmp"; set -C; cat >"$1.tmp"
    chmod "$2" -- "$1.tmp"; mv -f -T -- "$1.tmp" "$1"' put "$1" "$2"
}

# secret FILE: the password in $base/FILE.
secret() { run_as head -n 1 -- "$base/$1" 2>/dev/null || true; }

# 48 hex digits: no URL or YAML escaping needed.
new_password() { od -An -tx1 -N24 /dev/urandom | tr -d ' \n'; }

# admin_url HOSTS [QUERY]: the superuser's URL, with its password.
admin_url() {
  local pw
  pw=$(secret admin.password)
  [ -n "$pw" ] || refuse "no admin password in $base yet: run scripts/$(basename "$0") start"
  echo "postgres://postgres:$pw@$1/postgres${2:-}"
}
