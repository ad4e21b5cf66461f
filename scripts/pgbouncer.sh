#!/usr/bin/env bash
# PgBouncer in transaction mode in front of a local Postgres: what the tests
# of DATABASE_POOL_MODE=transaction run through, and a way to try it by hand.
#
#   PGBOUNCER_DIR=/tmp/pgb PGBOUNCER_PORT=6433 PGBOUNCER_UPSTREAM_PORT=5432 \
#   PGBOUNCER_USERS="ingest_app relay_app" PGBOUNCER_PASSWORD=secret scripts/pgbouncer.sh start
#   PGBOUNCER_DIR=/tmp/pgb scripts/pgbouncer.sh stop
#
# - Installs Debian's `pgbouncer` package when there is no pgbouncer.
# - Runs it as an unprivileged user even when called by root (PgBouncer
#   refuses to run as root), as scripts/pg-cluster.sh runs the server.
# - Every database of the upstream server under its own name; the users in
#   PGBOUNCER_USERS (space-separated) may log in. Clients are trusted (this
#   is for loopback tests only); to the server, which asks for passwords
#   (scripts/pg-cluster.sh's does), PgBouncer logs in as each of them with
#   PGBOUNCER_PASSWORD, kept in its auth_file (mode 0600).
# - The settings deploy/README.md recommends: pool_mode = transaction,
#   ignore_startup_parameters = extra_float_digits,options. Few server
#   connections per database and user (PGBOUNCER_POOL_SIZE, default 2), so a
#   client pool larger than that is multiplexed for real: a statement
#   prepared on one server connection is unknown on the next.
set -euo pipefail

dir=${PGBOUNCER_DIR:?PGBOUNCER_DIR must name a folder for the config, log and pid}
ini=$dir/pgbouncer.ini
pidfile=$dir/pgbouncer.pid

say() { printf 'pgbouncer.sh: %s\n' "$*" >&2; }

find_pgbouncer() {
  command -v pgbouncer 2>/dev/null || { [ -x /usr/sbin/pgbouncer ] && echo /usr/sbin/pgbouncer; } || true
}

install_pgbouncer() {
  say "no pgbouncer found; installing Debian's pgbouncer package"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -qq pgbouncer >&2 || {
    $sudo apt-get update -qq >&2
    $sudo apt-get install -y -qq pgbouncer >&2
  }
}

pick_user() {
  if [ "$(id -u)" != 0 ]; then run_user=""; return; fi
  if id postgres >/dev/null 2>&1; then run_user=postgres; return; fi
  run_user=pgcluster
  id "$run_user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$run_user"
}

as_user() {
  if [ -z "$run_user" ]; then "$@"; else runuser -u "$run_user" -- "$@"; fi
}

start() {
  local port=${PGBOUNCER_PORT:?PGBOUNCER_PORT must be set}
  local upstream=${PGBOUNCER_UPSTREAM_PORT:?PGBOUNCER_UPSTREAM_PORT must be set}
  local bin
  bin=$(find_pgbouncer)
  if [ -z "$bin" ]; then install_pgbouncer; bin=$(find_pgbouncer); fi
  [ -n "$bin" ] || { say "could not find or install pgbouncer"; exit 1; }
  pick_user
  mkdir -p "$dir"
  local password=${PGBOUNCER_PASSWORD:-}
  password=${password//\"/\"\"}
  (umask 077 && : >"$dir/userlist.txt")
  chmod 0600 "$dir/userlist.txt"
  for user in ${PGBOUNCER_USERS:-}; do printf '"%s" "%s"\n' "$user" "$password" >>"$dir/userlist.txt"; done
  cat >"$ini" <<EOF
[databases]
* = host=127.0.0.1 port=$upstream

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = ${PGBOUNCER_POOL_SIZE:-2}
max_client_conn = 500
; tokio-postgres sends neither, but other clients (psql, JDBC) do; the
; services in DATABASE_POOL_MODE=transaction send no options.
ignore_startup_parameters = extra_float_digits,options
server_check_delay = 1
logfile = $dir/pgbouncer.log
pidfile = $pidfile
EOF
  if [ "$(id -u)" = 0 ] && [ -n "$run_user" ]; then chown -R "$run_user" "$dir"; fi
  as_user "$bin" -d "$ini" >"$dir/start.log" 2>&1 || { cat "$dir/start.log" "$dir/pgbouncer.log" >&2 2>/dev/null; exit 1; }
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  say "pgbouncer did not listen on $port; its log:"
  tail -n 20 "$dir/pgbouncer.log" >&2 || true
  exit 1
}

stop() {
  [ -f "$pidfile" ] || return 0
  local pid
  pid=$(cat "$pidfile")
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.05
  done
  say "pgbouncer ($pid) did not stop"
  exit 1
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop (see the header for the environment)" >&2; exit 2 ;;
esac
