#!/usr/bin/env bash
# A throwaway local PostgreSQL for `make run`, `make test` and `make bench` without DATABASE_URL.
#
#   scripts/pg-cluster.sh start   # create (first time) and start; prints the admin URL
#   scripts/pg-cluster.sh url     # prints the admin URL (does not start)
#   scripts/pg-cluster.sh stop    # fast shutdown
#   scripts/pg-cluster.sh status  # running or stopped (the URL without its password)
#
# - The machine's server binaries (Debian's installed if none), run by an unprivileged
#   user in a 0700 folder (cluster-common.sh): /tmp/webhook-pg-<key>, keyed by the
#   checkout's path (PG_CLUSTER_DIR: another), and a port from the key (PG_CLUSTER_PORT).
# - Over TCP every user gives its password; the admin's is random, in admin.password
#   (0600), printed only inside the admin URL. The socket, in the folder, trusts.
#   `start` upgrades a cluster an older script left trusting everyone.
# - TLS with PG_CLUSTER_SSL_CERT and PG_CLUSTER_SSL_KEY (PEM); plain connections still work.
set -euo pipefail

say() { printf 'pg-cluster: %s\n' "$*" >&2; }
# shellcheck source=scripts/cluster-common.sh
. "$(dirname "$0")/cluster-common.sh"

key=$(checkout_key)
base=${PG_CLUSTER_DIR:-/tmp/webhook-pg-$key}
base=${base%/}
data=$base/data
# 20000..29999: above the usual service ports, below the ephemeral range.
port=${PG_CLUSTER_PORT:-$((20000 + 0x${key:0:4} % 10000))}
# The admin password waits in admin.password.new until the server has it.
pending=$base/admin.password.new
hba='local all all trust
host all all 127.0.0.1/32 scram-sha-256'

running() {
  [ -f "$data/postmaster.pid" ] && run_as "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1
}

create() {
  say "creating a cluster in $data (port $port, user $pg_user)"
  local init=$base/admin.password
  if run_as test -s "$pending"; then init=$pending; fi
  run_as rm -rf -- "$data"
  run_as "$bindir/initdb" -D "$data" -U postgres --pwfile="$init" --auth-local=trust \
    --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null 9>&-
  run_as tee -a -- "$data/postgresql.conf" >/dev/null <<CONF
# scripts/pg-cluster.sh: loopback and the private folder only; room for parallel tests.
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$base'
max_connections = 400
shared_buffers = 256MB
max_wal_size = 2GB
log_min_error_statement = panic
CONF
}

start() {
  bindir=$(find_bindir)
  if [ -z "$bindir" ]; then apt_install postgresql postgresql-contrib; bindir=$(find_bindir); fi
  [ -n "$bindir" ] || refuse "could not find or install PostgreSQL server binaries"
  pick_user
  make_base
  lock_base
  if ! run_as test -s "$base/admin.password" && ! run_as test -s "$pending"; then
    new_password | put "$pending" 0600
  fi
  [ -f "$data/PG_VERSION" ] || create
  local reload=false ssl=()
  if [ "$(run_as cat -- "$data/pg_hba.conf" 2>/dev/null || true)" != "$hba" ]; then
    put "$data/pg_hba.conf" 0600 <<<"$hba"
    reload=true
  fi
  if [ -n "${PG_CLUSTER_SSL_CERT:-}" ]; then
    [ -n "${PG_CLUSTER_SSL_KEY:-}" ] || { say "PG_CLUSTER_SSL_CERT needs PG_CLUSTER_SSL_KEY"; exit 2; }
    # Read by the caller (the server's user may not reach them), written by the server's user.
    put "$data/server.crt" 0644 <"$PG_CLUSTER_SSL_CERT"
    put "$data/server.key" 0600 <"$PG_CLUSTER_SSL_KEY"
    ssl=(-o "-c ssl=on")
  fi
  if ! running; then
    run_as rm -f -- "$data/postmaster.pid"
    if ! run_as "$bindir/pg_ctl" -D "$data" -l "$base/server.log" -w -t 60 "${ssl[@]}" start \
      >/dev/null 2>&1 9>&-; then
      say "the cluster did not start; its log:"
      run_as tail -n 30 -- "$base/server.log" >&2
      exit 1
    fi
  elif $reload; then
    say "pg_hba.conf rewritten (TCP logins need a password): reloading"
    run_as "$bindir/pg_ctl" -D "$data" reload >/dev/null 9>&-
  fi
  if run_as test -s "$pending"; then
    # Over the socket, which trusts; the password on psql's stdin, never in argv or the log.
    printf "SET log_statement = 'none';\nALTER ROLE postgres PASSWORD '%s';\n" \
      "$(secret admin.password.new)" \
      | run_as "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h "$base" -p "$port" -U postgres \
        >/dev/null 9>&- || refuse "could not set the admin password over the socket in $base"
    run_as mv -f -T -- "$pending" "$base/admin.password"
  fi
  admin_url "127.0.0.1:$port"
}

stop() {
  bindir=$(find_bindir)
  pick_user
  [ -n "$bindir" ] && exists || return 0
  check_base
  running || return 0
  run_as "$bindir/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null
  say "stopped the cluster in $data"
}

status() {
  bindir=$(find_bindir)
  pick_user
  if exists; then check_base; fi
  running || { echo "stopped ($data)"; exit 3; }
  echo "running: postgres://postgres@127.0.0.1:$port/postgres ($data)"
}

case "${1:-start}" in
  start) start ;;
  url) existing_base; admin_url "127.0.0.1:$port" ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|url|stop|status" >&2; exit 2 ;;
esac
