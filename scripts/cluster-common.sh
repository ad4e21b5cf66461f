#!/usr/bin/env bash
# Sourced by scripts/pg-cluster.sh, ha-cluster.sh, pgbouncer.sh and browser.sh:
# Debian's packages, the unprivileged user the servers run as, the private
# folder made and checked safely, files written by that user only, random
# passwords. The caller defines `say` and sets `base`, its folder.
# shellcheck shell=bash
# shellcheck disable=SC2154 # base and pg_user are the caller's and pick_user's

refuse() { say "$*"; exit 1; }

# apt_install PACKAGE...: installs Debian's packages (through sudo unless root).
apt_install() {
  say "installing Debian's $*"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -qq "$@" >/dev/null 2>&1 && return
  $sudo apt-get update -qq >&2
  $sudo apt-get install -y -qq "$@" >&2
}

# The folder of the PostgreSQL server binaries, the newest first; empty if none.
find_bindir() {
  local d
  for d in "$(pg_config --bindir 2>/dev/null)" $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V -r) \
    /usr/local/pgsql/bin "$(command -v initdb | xargs -r dirname)"; do
    if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/postgres" ]; then echo "$d"; return; fi
  done
}

# The servers' unprivileged user (PostgreSQL and PgBouncer refuse root): the
# caller, or for root `postgres`, else a system user made for the purpose.
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

# Refuses (exit 1, one line) unless $base is a real directory (not a link),
# owned by root or the server's user, writable by no group or other.
check_base() {
  local kind owner mode
  [ ! -L "$base" ] \
    || refuse "refusing $base: it is a symbolic link (remove it; the cluster's folder is never followed through a link)"
  kind=$(stat -c %F -- "$base")
  [ "$kind" = directory ] || refuse "refusing $base: it is a $kind, not a directory"
  owner=$(stat -c %U -- "$base")
  [ "$owner" = root ] || [ "$owner" = "$pg_user" ] \
    || refuse "refusing $base: it is owned by $owner, not root or $pg_user (someone else made it)"
  mode=$(stat -c %a -- "$base")
  (((8#$mode & 8#022) == 0)) || refuse "refusing $base: it is group- or world-writable (mode $mode)"
}

# Makes (`mkdir -m 0700` of its last component only) and checks $base, then
# gives it to the server's user, mode 0700. Its parent must exist and be
# sticky (like /tmp) or writable by no one else, so no one can swap it once
# checked.
make_base() {
  local parent pmode
  parent=$(dirname -- "$base")
  [ -d "$parent" ] || refuse "refusing $base: its parent $parent does not exist"
  pmode=$(stat -L -c %a -- "$parent")
  if (((8#$pmode & 8#022) != 0 && (8#$pmode & 8#1000) == 0)); then
    refuse "refusing $base: its parent $parent is writable by others and not sticky (mode $pmode)"
  fi
  if [ ! -e "$base" ] && [ ! -L "$base" ]; then
    mkdir -m 0700 -- "$base" 2>/dev/null || [ -e "$base" ] || [ -L "$base" ] \
      || refuse "could not create $base"
  fi
  check_base
  if [ "$(id -u)" = 0 ]; then chown -- "$pg_user" "$base"; fi
  chmod 0700 -- "$base"
}

# For the verbs that do not create the folder: it must exist, and be safe.
existing_base() {
  pick_user
  exists || refuse "no cluster in $base yet: run scripts/$(basename "$0") start"
  check_base
}

exists() { [ -e "$base" ] || [ -L "$base" ]; }

# put FILE MODE: stdin into FILE, written by the server's user (never by
# root, so never through a link that user could plant), in one rename.
put() {
  # shellcheck disable=SC2016 # expanded by the inner bash
  run_as bash -c 'set -euo pipefail; umask 077; rm -f -- "$1.tmp"; set -C; cat >"$1.tmp"
    chmod "$2" -- "$1.tmp"; mv -f -T -- "$1.tmp" "$1"' put "$1" "$2"
}

# A new random password: 48 hex digits (no URL or YAML escaping needed).
new_password() {
  od -An -tx1 -N24 /dev/urandom | tr -d ' \n'
}
