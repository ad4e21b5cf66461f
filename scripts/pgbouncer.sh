#!/usr/bin/env bash
# `start|stop`: Debian's PgBouncer (installed when missing) in transaction mode in front of
# 127.0.0.1:PGBOUNCER_UPSTREAM_PORT, on PGBOUNCER_PORT, for the DATABASE_POOL_MODE=transaction
# tests (crates/testkit/src/pgbouncer.rs). Clients are trusted (loopback tests only); to the
# server it logs in as each of PGBOUNCER_USERS with PGBOUNCER_PASSWORD (auth_file, 0600).
# deploy/README.md's settings, two server connections per pool: clients multiplexed for real.
set -euo pipefail

dir=${PGBOUNCER_DIR:?PGBOUNCER_DIR must name a folder for the config, log and pid}
say() { printf 'pgbouncer.sh: %s\n' "$*" >&2; }
# shellcheck source=scripts/cluster-common.sh
. "$(dirname "$0")/cluster-common.sh"

start() {
  local port=${PGBOUNCER_PORT:?PGBOUNCER_PORT must be set} password=${PGBOUNCER_PASSWORD:-} user
  export PATH=$PATH:/usr/sbin
  command -v pgbouncer >/dev/null || apt_install pgbouncer
  pick_user
  mkdir -p "$dir"
  for user in ${PGBOUNCER_USERS:-}; do
    printf '"%s" "%s"\n' "$user" "${password//\"/\"\"}"
  done | (umask 077 && cat >"$dir/userlist.txt")
  chmod 0600 "$dir/userlist.txt"
  cat >"$dir/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=${PGBOUNCER_UPSTREAM_PORT:?PGBOUNCER_UPSTREAM_PORT must be set}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = 2
max_client_conn = 500
; tokio-postgres sends neither, other clients (psql, JDBC) do.
ignore_startup_parameters = extra_float_digits,options
server_check_delay = 1
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
  if [ "$(id -u)" = 0 ]; then chown -R "$pg_user" "$dir"; fi
  run_as pgbouncer -d "$dir/pgbouncer.ini" >"$dir/start.log" 2>&1 \
    || { cat "$dir/start.log" "$dir/pgbouncer.log" >&2 2>/dev/null; exit 1; }
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return
    sleep 0.05
  done
  refuse "pgbouncer did not listen on $port; see $dir/pgbouncer.log"
}

stop() {
  local pid
  pid=$(cat "$dir/pgbouncer.pid" 2>/dev/null) || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  timeout 5 tail -s 0.05 --pid="$pid" -f /dev/null || refuse "pgbouncer ($pid) did not stop"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop (see the header for the environment)" >&2; exit 2 ;;
esac
