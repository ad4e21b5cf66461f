#!/usr/bin/env bash
# A throwaway local PostgreSQL cluster for `make run`, `make test` and
# `make bench` when DATABASE_URL is not set.
#
#   scripts/pg-cluster.sh start   # create (first time) and start; prints the admin URL
#   scripts/pg-cluster.sh url     # prints the admin URL (does not start)
#   scripts/pg-cluster.sh stop    # fast shutdown
#   scripts/pg-cluster.sh restart # fast shutdown, then start (used by fault tests)
#   scripts/pg-cluster.sh status  # running or stopped (the URL without its password)
#
# - The machine's PostgreSQL server binaries (Debian's installed if none),
#   run by an unprivileged user, in a 0700 folder (cluster-common.sh):
#   /tmp/webhook-pg-<key>, keyed by the checkout's path (PG_CLUSTER_DIR:
#   another), reachable by that user; a port from the key (PG_CLUSTER_PORT).
# - Over TCP every user gives its password (scram-sha-256); the admin's is
#   random, in admin.password (0600), printed only inside the admin URL. The
#   socket, in the folder, trusts. `start` upgrades a cluster an older script
#   left trusting everyone. Durability: PostgreSQL's defaults.
# - TLS with PG_CLUSTER_SSL_CERT and PG_CLUSTER_SSL_KEY (PEM): copied into the
#   data directory (0600) and `ssl` on; plain connections still work.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd -P)
key=$(printf '%s' "$root" | sha1sum | cut -c1-10)
base=${PG_CLUSTER_DIR:-/tmp/webhook-pg-$key}
base=${base%/}
data=$base/data
log=$base/server.log
# The admin password; admin.password.new while it is not yet set in the server.
pwfile=$base/admin.password
pending=$base/admin.password.new
# 20000..29999: above the usual service ports, below the ephemeral range.
port=${PG_CLUSTER_PORT:-$((20000 + 0x${key:0:4} % 10000))}

say() { printf 'pg-cluster: %s\n' "$*" >&2; }
# shellcheck source=scripts/cluster-common.sh
. "$(dirname "$0")/cluster-common.sh"

# append FILE: stdin at the end of FILE, written by the server's user.
append() {
  # shellcheck disable=SC2016 # expanded by the inner bash
  run_as bash -c 'cat >>"$1"' append "$1"
}

admin_url() {
  local pw
  pw=$(run_as head -n 1 -- "$pwfile" 2>/dev/null || true)
  [ -n "$pw" ] || refuse "no admin password in $pwfile yet: run scripts/pg-cluster.sh start"
  echo "postgres://postgres:$pw@127.0.0.1:$port/postgres"
}

hba() {
  cat <<'HBA'
# scripts/pg-cluster.sh: TCP demands each user's password (scram-sha-256);
# the Unix socket trusts, as its folder only the server's user (and root)
# may enter.
# TYPE  DATABASE     USER  ADDRESS       METHOD
local   all          all                 trust
host    all          all   127.0.0.1/32  scram-sha-256
host    all          all   ::1/128       scram-sha-256
local   replication  all                 trust
host    replication  all   127.0.0.1/32  scram-sha-256
host    replication  all   ::1/128       scram-sha-256
HBA
}

configure_ssl() {
  [ -n "${PG_CLUSTER_SSL_CERT:-}" ] || return 0
  [ -n "${PG_CLUSTER_SSL_KEY:-}" ] || { say "PG_CLUSTER_SSL_CERT needs PG_CLUSTER_SSL_KEY"; exit 2; }
  # Read by the caller (the server's user may not reach them), written by the server's user.
  put "$data/server.crt" 0644 <"$PG_CLUSTER_SSL_CERT"
  put "$data/server.key" 0600 <"$PG_CLUSTER_SSL_KEY"
  run_as grep -q '^# --- tls (PG_CLUSTER_SSL_CERT)' "$data/postgresql.conf" && return
  append "$data/postgresql.conf" <<CONF

# --- tls (PG_CLUSTER_SSL_CERT)
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
CONF
}

running() {
  [ -f "$data/postmaster.pid" ] && run_as "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1
}

# Sets the pending password in the server (over the socket, which trusts;
# the SQL on psql's stdin, not its argv), then makes it the password.
apply_password() {
  local pw
  pw=$(run_as head -n 1 -- "$pending")
  [ -n "$pw" ] || refuse "$pending is empty"
  printf "SET log_statement = 'none';\nALTER ROLE postgres PASSWORD '%s';\n" "$pw" \
    | run_as "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h "$base" -p "$port" -U postgres -d postgres >/dev/null 9>&- \
    || refuse "could not set the admin password over the socket in $base"
  run_as mv -f -T -- "$pending" "$pwfile"
}

create() {
  say "creating a cluster in $data (port $port, user $pg_user)"
  local init=$pwfile locale out
  if run_as test -s "$pending"; then init=$pending; fi
  run_as rm -rf -- "$data"
  for locale in --locale=C.UTF-8 --no-locale; do
    out=$(run_as "$bindir/initdb" -D "$data" -U postgres --pwfile="$init" --auth-local=trust \
      --auth-host=scram-sha-256 -E UTF8 "$locale" 2>&1 9>&-) && break
  done
  run_as test -f "$data/PG_VERSION" || { printf '%s\n' "$out" >&2; exit 1; }
  append "$data/postgresql.conf" <<CONF

# --- throwaway cluster for webhook-ingest / outbox-relay (scripts/pg-cluster.sh)
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$base'
max_connections = 400
shared_buffers = 256MB
max_wal_size = 2GB
log_min_messages = warning
log_min_error_statement = panic
password_encryption = 'scram-sha-256'
CONF
}

start() {
  bindir=$(find_bindir)
  if [ -z "$bindir" ]; then apt_install postgresql postgresql-contrib; bindir=$(find_bindir); fi
  [ -n "$bindir" ] || refuse "could not find or install PostgreSQL server binaries"
  pick_user
  make_base
  # Concurrent callers (parallel test processes) wait for one another here.
  exec 9<"$base"
  flock 9
  if ! run_as test -s "$pwfile" && ! run_as test -s "$pending"; then
    new_password | put "$pending" 0600
  fi
  [ -f "$data/PG_VERSION" ] || create
  local reload=false
  if [ "$(run_as cat -- "$data/pg_hba.conf" 2>/dev/null || true)" != "$(hba)" ]; then
    hba | put "$data/pg_hba.conf" 0600
    reload=true
  fi
  configure_ssl
  if ! running; then
    run_as rm -f -- "$data/postmaster.pid"
    run_as "$bindir/pg_ctl" -D "$data" -l "$log" -w -t 60 start >/dev/null 2>&1 9>&- \
      || { say "the cluster did not start; its log:"; run_as tail -n 30 -- "$log" >&2; exit 1; }
  elif $reload; then
    say "pg_hba.conf rewritten: TCP logins now need a password; reloading"
    run_as "$bindir/pg_ctl" -D "$data" reload >/dev/null 9>&-
  fi
  if run_as test -s "$pending"; then apply_password; fi
  admin_url
}

stop() {
  bindir=$(find_bindir)
  [ -n "$bindir" ] || exit 0
  pick_user
  exists || return 0
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
  url) existing_base; admin_url ;;
  stop) stop ;;
  restart) stop; start ;;
  status) status ;;
  *) echo "usage: $0 start|url|stop|restart|status" >&2; exit 2 ;;
esac
