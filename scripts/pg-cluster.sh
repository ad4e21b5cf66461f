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
# - Uses the machine's PostgreSQL server binaries; installs Debian's
#   `postgresql` package when there are none.
# - Runs the server as an unprivileged user even when called by root
#   (PostgreSQL refuses to run as root): `postgres` if it exists, else a
#   system user created for the purpose.
# - Passwords: over TCP (127.0.0.1) every user must give its password
#   (scram-sha-256). The admin user `postgres` gets a random password at
#   creation (from /dev/urandom), kept in admin.password in the cluster's
#   folder (mode 0600, the server's user's); `start` and `url` print it inside
#   the admin URL, and nothing else prints it. The Unix socket trusts, but it
#   lives in that folder, which only the server's user (and root) may enter.
#   A cluster made by an older version of this script (trust everywhere, no
#   password file) is upgraded in place by the next `start`: the password is
#   set over the socket, pg_hba.conf rewritten and the server reloaded.
# - Keeps its data in /tmp/webhook-pg-<key>, keyed by the checkout's path, so
#   two checkouts never share a cluster; it is reused by later runs until
#   `stop` (the data stays until /tmp is cleaned). It stays in /tmp because
#   the server's user must be able to reach it, and a checkout under /root
#   (mode 0700) is out of its reach. /tmp is everyone's, so the folder is
#   made safely: `mkdir -m 0700` of that one name (its parent must exist, and
#   be sticky or writable by no one else), then owned by the server's user.
#   An existing path is used only if it is a real directory (not a symbolic
#   link), owned by root or the server's user and writable by no group or
#   other; else the script refuses, in one line, and touches nothing. Every
#   file in the folder is written by the server's user, never by root, so
#   no link planted there can make root write elsewhere; the lock is the
#   folder itself (flock), not a file in it. PG_CLUSTER_DIR names another
#   folder (its parent must exist), PG_CLUSTER_PORT another port.
# - Listens on 127.0.0.1 on a private port derived from the same key (the
#   machine may already run a Postgres on 5432), and on a socket in its folder.
# - Durability stays at PostgreSQL's defaults: the benchmark measures against
#   it and reports the settings.
# - TLS (for tests of sslmode=require / verify-full): with PG_CLUSTER_SSL_CERT
#   and PG_CLUSTER_SSL_KEY naming a server certificate and its key (PEM),
#   `start` copies them into the data directory (owned by the server's user,
#   mode 0600, as PostgreSQL demands of a key) and turns `ssl` on. Plain
#   connections keep working; clients choose with sslmode.
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
# What status shows; start and url print it with the password.
shown_url="postgres://postgres@127.0.0.1:$port/postgres"

say() { printf 'pg-cluster: %s\n' "$*" >&2; }
# shellcheck source=scripts/cluster-common.sh
. "$(dirname "$0")/cluster-common.sh"
find_bindir() {
  local d
  if command -v pg_config >/dev/null 2>&1; then
    d=$(pg_config --bindir 2>/dev/null || true)
    if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/postgres" ]; then echo "$d"; return; fi
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r) /usr/local/pgsql/bin; do
    if [ -x "$d/initdb" ] && [ -x "$d/postgres" ]; then echo "$d"; return; fi
  done
  if command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1; then
    dirname "$(command -v initdb)"; return
  fi
}

install_server() {
  say "no PostgreSQL server binaries found; installing Debian's postgresql package"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >&2
  $sudo apt-get install -y -qq postgresql postgresql-contrib >&2
}

# append FILE: stdin at the end of FILE, written by the server's user.
append() {
  # shellcheck disable=SC2016 # expanded by the inner bash
  run_as bash -c 'cat >>"$1"' append "$1"
}

# The password start and url print: the one set in the server.
password() {
  run_as head -n 1 -- "$pwfile" 2>/dev/null || true
}

admin_url() {
  local pw
  pw=$(password)
  [ -n "$pw" ] || refuse "no admin password in $pwfile yet: run scripts/pg-cluster.sh start"
  echo "postgres://postgres:$pw@127.0.0.1:$port/postgres"
}

hba() {
  cat <<'EOF'
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
EOF
}

hba_differs() {
  [ "$(run_as cat -- "$data/pg_hba.conf" 2>/dev/null || true)" != "$(hba)" ]
}

# PG_CLUSTER_SSL_CERT / PG_CLUSTER_SSL_KEY: serve TLS with that certificate.
configure_ssl() {
  [ -n "${PG_CLUSTER_SSL_CERT:-}" ] || return 0
  [ -n "${PG_CLUSTER_SSL_KEY:-}" ] || { say "PG_CLUSTER_SSL_CERT needs PG_CLUSTER_SSL_KEY"; exit 2; }
  # Read by the caller (they may be where the server's user cannot reach),
  # written by the server's user.
  put "$data/server.crt" 0644 <"$PG_CLUSTER_SSL_CERT"
  put "$data/server.key" 0600 <"$PG_CLUSTER_SSL_KEY"
  if ! run_as grep -q '^# --- tls (PG_CLUSTER_SSL_CERT)' "$data/postgresql.conf"; then
    append "$data/postgresql.conf" <<EOF

# --- tls (PG_CLUSTER_SSL_CERT)
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
EOF
  fi
}

running() {
  [ -f "$data/postmaster.pid" ] && run_as "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1
}

# Sets the pending password in the server (over the socket: it trusts) and
# makes it the password; the SQL goes through psql's stdin, not its argv.
apply_password() {
  local pw
  pw=$(run_as head -n 1 -- "$pending")
  [ -n "$pw" ] || refuse "$pending is empty"
  printf "SET log_statement = 'none';\nALTER ROLE postgres PASSWORD '%s';\n" "$pw" \
    | run_as "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h "$base" -p "$port" -U postgres -d postgres >/dev/null 9>&- \
    || refuse "could not set the admin password over the socket in $base"
  run_as mv -f -T -- "$pending" "$pwfile"
}

start() {
  bindir=$(find_bindir)
  if [ -z "$bindir" ]; then install_server; bindir=$(find_bindir); fi
  [ -n "$bindir" ] || { say "could not find or install PostgreSQL server binaries"; exit 1; }
  pick_user
  make_base
  # Concurrent callers (parallel test processes) wait for one another here.
  exec 9<"$base"
  flock 9
  if ! run_as test -s "$pwfile" && ! run_as test -s "$pending"; then
    new_password | put "$pending" 0600
  fi
  if [ ! -f "$data/PG_VERSION" ]; then
    say "creating a cluster in $data (port $port, user $pg_user)"
    local init=$pwfile out
    if run_as test -s "$pending"; then init=$pending; fi
    run_as rm -rf -- "$data"
    out=$(run_as "$bindir/initdb" -D "$data" -U postgres --pwfile="$init" --auth-local=trust --auth-host=scram-sha-256 \
      -E UTF8 --locale=C.UTF-8 2>&1 9>&-) \
      || out=$(run_as "$bindir/initdb" -D "$data" -U postgres --pwfile="$init" --auth-local=trust --auth-host=scram-sha-256 \
        -E UTF8 --no-locale 2>&1 9>&-) \
      || { printf '%s\n' "$out" >&2; exit 1; }
    append "$data/postgresql.conf" <<EOF

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
EOF
  fi
  local reload=false
  if hba_differs; then hba | put "$data/pg_hba.conf" 0600; reload=true; fi
  configure_ssl
  if running; then
    if $reload; then
      say "pg_hba.conf rewritten: TCP logins now need a password; reloading"
      run_as "$bindir/pg_ctl" -D "$data" reload >/dev/null 9>&-
    fi
  else
    run_as rm -f -- "$data/postmaster.pid"
    run_as "$bindir/pg_ctl" -D "$data" -l "$log" -w -t 60 start >/dev/null 2>&1 9>&- \
      || { say "the cluster did not start; its log:"; run_as tail -n 30 -- "$log" >&2; exit 1; }
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
  if running; then
    run_as "$bindir/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null
    say "stopped the cluster in $data"
  fi
}

status() {
  bindir=$(find_bindir)
  pick_user
  if exists; then check_base; fi
  if running; then echo "running: $shown_url ($data)"; else echo "stopped ($data)"; exit 3; fi
}

url() {
  pick_user
  exists || refuse "no cluster in $base yet: run scripts/pg-cluster.sh start"
  check_base
  admin_url
}

case "${1:-start}" in
  start) start ;;
  url) url ;;
  stop) stop ;;
  restart) stop; start ;;
  status) status ;;
  *) echo "usage: $0 start|url|stop|restart|status" >&2; exit 2 ;;
esac
