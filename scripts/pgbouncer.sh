#!/usr/bin/env bash
# PgBouncer in transaction mode in front of a local Postgres: what the tests
# of DATABASE_POOL_MODE=transaction run through, and a way to try it by hand.
#
#   PGBOUNCER_DIR=/tmp/pgb PGBOUNCER_PORT=6433 PGBOUNCER_UPSTREAM_PORT=5432 \
#   PGBOUNCER_USERS="ingest_app relay_app" PGBOUNCER_PASSWORD=secret scripts/pgbouncer.sh start
#   PGBOUNCER_DIR=/tmp/pgb scripts/pgbouncer.sh stop
#
# - Debian's `pgbouncer` (installed when missing), run by an unprivileged user
#   as pg-cluster.sh runs the server. Clients are trusted (loopback tests
#   only); to the server it logs in as each of PGBOUNCER_USERS with
#   PGBOUNCER_PASSWORD (auth_file, mode 0600), to every database.
# - deploy/README.md's settings (pool_mode = transaction, ignore_startup_parameters),
#   with few server connections (PGBOUNCER_POOL_SIZE, default 2), so clients
#   are multiplexed for real.
set -euo pipefail

dir=${PGBOUNCER_DIR:?PGBOUNCER_DIR must name a folder for the config, log and pid}
pidfile=$dir/pgbouncer.pid

say() { printf 'pgbouncer.sh: %s\n' "$*" >&2; }
# shellcheck source=scripts/cluster-common.sh
. "$(dirname "$0")/cluster-common.sh"

start() {
  local port=${PGBOUNCER_PORT:?PGBOUNCER_PORT must be set}
  local upstream=${PGBOUNCER_UPSTREAM_PORT:?PGBOUNCER_UPSTREAM_PORT must be set}
  local password=${PGBOUNCER_PASSWORD:-} user
  export PATH=$PATH:/usr/sbin
  command -v pgbouncer >/dev/null || apt_install pgbouncer
  command -v pgbouncer >/dev/null || refuse "could not find or install pgbouncer"
  pick_user
  mkdir -p "$dir"
  (umask 077 && : >"$dir/userlist.txt")
  chmod 0600 "$dir/userlist.txt"
  for user in ${PGBOUNCER_USERS:-}; do
    printf '"%s" "%s"\n' "$user" "${password//\"/\"\"}" >>"$dir/userlist.txt"
  done
  cat >"$dir/pgbouncer.ini" <<INI
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
; tokio-postgres sends neither, other clients (psql, JDBC) do.
ignore_startup_parameters = extra_float_digits,options
server_check_delay = 1
logfile = $dir/pgbouncer.log
pidfile = $pidfile
INI
  if [ "$(id -u)" = 0 ]; then chown -R "$pg_user" "$dir"; fi
  run_as pgbouncer -d "$dir/pgbouncer.ini" >"$dir/start.log" 2>&1 \
    || { cat "$dir/start.log" "$dir/pgbouncer.log" >&2 2>/dev/null; exit 1; }
  for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  say "pgbouncer did not listen on $port; its log:"
  tail -n 20 "$dir/pgbouncer.log" >&2 || true
  exit 1
}

stop() {
  local pid
  pid=$(cat "$pidfile" 2>/dev/null) || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.05
  done
  refuse "pgbouncer ($pid) did not stop"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop (see the header for the environment)" >&2; exit 2 ;;
esac
