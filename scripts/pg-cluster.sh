#!/usr/bin/env bash
# A throwaway local PostgreSQL cluster for `make run`, `make test` and
# `make bench` when DATABASE_URL is not set.
#
#   scripts/pg-cluster.sh start   # create (first time) and start; prints the admin URL
#   scripts/pg-cluster.sh url     # prints the admin URL (does not start)
#   scripts/pg-cluster.sh stop    # fast shutdown
#   scripts/pg-cluster.sh restart # fast shutdown, then start (used by fault tests)
#   scripts/pg-cluster.sh status
#
# - Uses the machine's PostgreSQL server binaries; installs Debian's
#   `postgresql` package when there are none.
# - Runs the server as an unprivileged user even when called by root
#   (PostgreSQL refuses to run as root): `postgres` if it exists, else a
#   system user created for the purpose.
# - Keeps its data under /tmp, keyed by the checkout's path, so a checkout under
#   /root works and two checkouts never share a cluster; it is reused by later
#   runs until `stop` (the data stays until /tmp is cleaned).
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
data=$base/data
log=$base/server.log
# 20000..29999: above the usual service ports, below the ephemeral range.
port=${PG_CLUSTER_PORT:-$((20000 + 0x${key:0:4} % 10000))}
url="postgres://postgres@127.0.0.1:$port/postgres"

say() { printf 'pg-cluster: %s\n' "$*" >&2; }

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

# The unprivileged user the server runs as, and how to run a command as it.
run_as() {
  if [ "$(id -u)" != 0 ]; then "$@"; return; fi
  runuser -u "$pg_user" -- "$@"
}

pick_user() {
  if [ "$(id -u)" != 0 ]; then pg_user=$(id -un); return; fi
  if id postgres >/dev/null 2>&1; then pg_user=postgres; return; fi
  pg_user=pgcluster
  if ! id "$pg_user" >/dev/null 2>&1; then
    say "creating system user $pg_user to run the cluster"
    useradd --system --no-create-home --shell /usr/sbin/nologin "$pg_user"
  fi
}

# PG_CLUSTER_SSL_CERT / PG_CLUSTER_SSL_KEY: serve TLS with that certificate.
configure_ssl() {
  [ -n "${PG_CLUSTER_SSL_CERT:-}" ] || return 0
  [ -n "${PG_CLUSTER_SSL_KEY:-}" ] || { say "PG_CLUSTER_SSL_CERT needs PG_CLUSTER_SSL_KEY"; exit 2; }
  install -m 0644 "$PG_CLUSTER_SSL_CERT" "$data/server.crt"
  install -m 0600 "$PG_CLUSTER_SSL_KEY" "$data/server.key"
  if [ "$(id -u)" = 0 ]; then chown "$pg_user" "$data/server.crt" "$data/server.key"; fi
  if ! grep -q '^# --- tls (PG_CLUSTER_SSL_CERT)' "$data/postgresql.conf"; then
    cat >>"$data/postgresql.conf" <<EOF

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

start() {
  bindir=$(find_bindir)
  if [ -z "$bindir" ]; then install_server; bindir=$(find_bindir); fi
  [ -n "$bindir" ] || { say "could not find or install PostgreSQL server binaries"; exit 1; }
  pick_user
  mkdir -p "$base"
  chmod 755 "$base"
  if [ "$(id -u)" = 0 ]; then chown "$pg_user" "$base"; fi
  # Concurrent callers (parallel test processes) wait for one another here.
  exec 9>"$base/.lock"
  flock 9
  if [ ! -f "$data/PG_VERSION" ]; then
    say "creating a cluster in $data (port $port, user $pg_user)"
    rm -rf "$data"
    run_as "$bindir/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$base/initdb.log" 2>&1 \
      || run_as "$bindir/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --no-locale >"$base/initdb.log" 2>&1 \
      || { cat "$base/initdb.log" >&2; exit 1; }
    cat >>"$data/postgresql.conf" <<EOF

# --- throwaway cluster for webhook-ingest / outbox-relay (scripts/pg-cluster.sh)
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$base'
max_connections = 400
shared_buffers = 256MB
max_wal_size = 2GB
log_min_messages = warning
log_min_error_statement = panic
EOF
  fi
  configure_ssl
  if running; then
    echo "$url"
    return
  fi
  rm -f "$data/postmaster.pid"
  if [ "$(id -u)" = 0 ]; then touch "$log" && chown "$pg_user" "$log"; fi
  run_as "$bindir/pg_ctl" -D "$data" -l "$log" -w -t 60 start >/dev/null 2>&1 9>&- \
    || { say "the cluster did not start; its log:"; tail -n 30 "$log" >&2; exit 1; }
  echo "$url"
}

stop() {
  bindir=$(find_bindir)
  [ -n "$bindir" ] || exit 0
  pick_user
  if running; then
    run_as "$bindir/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null
    say "stopped the cluster in $data"
  fi
}

case "${1:-start}" in
  start) start ;;
  url) echo "$url" ;;
  stop) stop ;;
  restart) stop; start ;;
  status) bindir=$(find_bindir); pick_user; if running; then echo "running: $url ($data)"; else echo "stopped ($data)"; exit 3; fi ;;
  *) echo "usage: $0 start|url|stop|restart|status" >&2; exit 2 ;;
esac
