#!/usr/bin/env bash
# A throwaway high-availability PostgreSQL for failover tests: Patroni with a
# one-member etcd, two Postgres nodes on 127.0.0.1, failing over in seconds.
#
#   scripts/ha-cluster.sh start    # create (first time) and start; prints the admin URL
#   scripts/ha-cluster.sh url      # prints the admin URL (does not start)
#   scripts/ha-cluster.sh primary  # `<name> <postgres port> <postmaster pid>` of the leader (exit 3: none)
#   scripts/ha-cluster.sh status   # `patronictl list` and the replication mode in force (exit 3: stopped)
#   scripts/ha-cluster.sh stop     # both Patroni agents (and their Postgres), then etcd; the data stays
#   scripts/ha-cluster.sh destroy  # stop, then remove the folder
#
# - Finding the primary: no HAProxy nor virtual IP. The admin URL (and every
#   URL a test derives from it) names both nodes with libpq's multi-host form,
#   postgres://...@127.0.0.1:<p1>,127.0.0.1:<p2>/db?target_session_attrs=read-write:
#   each client (libpq, tokio-postgres, so the services' pools) tries the
#   hosts in order and keeps the first that accepts writes, so a new
#   connection after a failover reaches the new primary, and a connection
#   to a node that was demoted is lost (its server restarts), not silently
#   kept on a read-only standby.
# - Replication: HA_CLUSTER_REPLICATION=sync (the default) runs Patroni's
#   `synchronous_mode: true`: the standby is the primary's synchronous
#   standby (synchronous_commit on), a commit is acknowledged only once the
#   standby has flushed it, and only that standby may be promoted, so a
#   failover loses no acknowledged write. (Not strict: with the standby gone
#   the primary goes on alone, and for that while its writes are on one node.)
#   `async` runs `synchronous_mode: false`: a commit is acknowledged once the
#   primary alone has flushed it, and the standby is promoted however far
#   behind it is (`maximum_lag_on_failover` is set far beyond any lag a test
#   makes): that is exactly how async replication loses acknowledged writes,
#   the last ones the dead primary had not yet sent. A `start` with the other
#   mode switches an existing cluster (the dynamic configuration in etcd) and
#   waits until the mode is in force on the primary.
# - Timings: `loop_wait` 1 s; `retry_timeout` 2 s and `ttl` 5 s, the
#   smallest Patroni 3.0.2 works with (below); `primary_start_timeout: 0`
#   (3.0.2's name; it maps the older `master_start_timeout` onto it): when
#   the primary's Postgres crashes, Patroni does not restart it in place
#   (crash recovery could take any time, and the services would wait for
#   it): as soon as a healthy standby may take over, it releases the leader
#   key and the standby is promoted. The old primary then comes back as a
#   standby of the new one: started in recovery, and rewound with pg_rewind
#   (`use_pg_rewind`, `wal_log_hints`) when it had WAL the new primary never
#   got (async), or copied afresh if that fails. So a SIGKILL of the
#   postmaster fails over in two or three seconds.
# - Uses Debian's `patroni` and `etcd-server` packages and the machine's
#   PostgreSQL server binaries, installing them (apt-get) when missing.
# - Security, as scripts/pg-cluster.sh: everything runs as an unprivileged
#   user (`postgres` if it exists, else a system user made for the purpose;
#   PostgreSQL refuses root). Random passwords from /dev/urandom, in files of
#   mode 0600 in the cluster's folder: the Postgres superuser `postgres`
#   (admin.password), the replication user (replication.password), Patroni's
#   REST API (restapi.password: its changing endpoints ask for it) and etcd's
#   `root` user (etcd.password: etcd's authentication is on, so no one else
#   on the machine can rewrite the configuration Patroni applies). Over TCP
#   Postgres demands scram-sha-256; each node's Unix socket trusts, as it
#   lives in the folder. Only `start` and `url` print a password, inside the
#   admin URL on stdout. The folder is /tmp/webhook-ha-<key>, keyed by the
#   checkout's path (HA_CLUSTER_DIR names another; its parent must exist),
#   made and checked as pg-cluster.sh does: `mkdir -m 0700` of that one name,
#   owned by the server's user; refused if it is a link, another user's, or
#   group- or world-writable. Every file in it is written by the server's
#   user, never by root; the lock is the folder itself (flock).
# - Ports, all on 127.0.0.1, from a base port (HA_CLUSTER_PORT; by default
#   derived from the key, in 30000..32759: above pg-cluster.sh's 20000..29999,
#   below Linux's ephemeral range): base etcd's clients, +1 etcd's peers,
#   +2 and +3 node1's and node2's Postgres, +4 and +5 their Patroni REST APIs.
# - Logs in the folder: etcd.log, node1/patroni.log and node2/patroni.log
#   (each Patroni with its Postgres's own output); a failed `start` prints
#   their tails on stderr. The daemons are detached (setsid, stdin from
#   /dev/null, output to their logs), so a caller reading this script's
#   output (Rust's Command::output) never waits on them.
# - Patroni 3.0.2 checks only that ttl, loop_wait and retry_timeout are
#   integers (the clamp to ttl >= 20, retry_timeout >= 3 came in later
#   versions), so the floors are what its code and etcd need. loop_wait: 1.
#   retry_timeout: 2. With 1 it starts, replicates and reports healthy, but
#   no standby can ever take the leader key: attempt_to_acquire_leader first
#   refreshes its etcd lease, then gives up ("attempt_to_acquire_leader
#   timeout", logged as "Error communicating with DCS") when less than 1 s of
#   retry_timeout is left, which with 1 is always (seen here: the crashed
#   primary released its key and the cluster stayed leaderless). ttl: 5,
#   Patroni's rule loop_wait + 2 x retry_timeout <= ttl (so that a primary
#   cut off from etcd demotes itself before its key expires and another
#   takes over); etcd 3.4 would anyway raise a lease under 2 s to 2 s. A
#   crashed primary does not wait for the ttl, it releases the key (above);
#   the ttl is how long a dead node, Patroni and all, keeps it.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd -P)
key=$(printf '%s' "$root" | sha1sum | cut -c1-10)
base=${HA_CLUSTER_DIR:-/tmp/webhook-ha-$key}
base=${base%/}
# Blocks of six ports: 30000 + 6k, k < 460.
port=${HA_CLUSTER_PORT:-$((30000 + 0x${key:0:4} % 460 * 6))}
replication=${HA_CLUSTER_REPLICATION:-sync}
nodes=(node1 node2)
# Patroni's scope: the etcd prefix, and Postgres's cluster_name (in its
# processes' titles).
scope=webhook-ha-$port

loop_wait=1
retry_timeout=2
ttl=5
# Bytes: far beyond any lag a test makes, so an async standby is always
# promoted (and loses what it had not received). Sync mode promotes only the
# synchronous standby, which has every acknowledged commit.
max_lag=1099511627776

say() { printf 'ha-cluster: %s\n' "$*" >&2; }
# shellcheck source=scripts/cluster-common.sh
. "$(dirname "$0")/cluster-common.sh"
case "$port" in
  '' | *[!0-9]*) say "HA_CLUSTER_PORT must be a number, not '$port'"; exit 2 ;;
esac
((port >= 1024 && port <= 65530)) || { say "HA_CLUSTER_PORT must be in 1024..65530 (it uses six ports from it)"; exit 2; }
case "$replication" in
  sync | async) ;;
  *) say "HA_CLUSTER_REPLICATION must be sync or async, not '$replication'"; exit 2 ;;
esac

etcd_port=$port
etcd_peer_port=$((port + 1))
pg_port() { if [ "$1" = node1 ]; then echo $((port + 2)); else echo $((port + 3)); fi; }
api_port() { if [ "$1" = node1 ]; then echo $((port + 4)); else echo $((port + 5)); fi; }

find_bindir() {
  local d
  if command -v pg_config >/dev/null 2>&1; then
    d=$(pg_config --bindir 2>/dev/null || true)
    if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && [ -x "$d/pg_rewind" ]; then echo "$d"; return; fi
  fi
  for d in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V -r) /usr/local/pgsql/bin; do
    if [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && [ -x "$d/pg_rewind" ]; then echo "$d"; return; fi
  done
  if command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1; then
    dirname "$(command -v initdb)"; return
  fi
}

apt_install() {
  say "installing Debian's $*"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >&2
  $sudo apt-get install -y -qq "$@" >&2
}

# The Python that runs Patroni (its packages are that interpreter's).
patroni_python() {
  local line
  line=$(head -n 1 -- "$(command -v patroni)")
  line=${line#\#!}
  if [ -x "${line%% *}" ]; then echo "${line%% *}"; else command -v python3; fi
}

# Sets bindir, patroni_bin, patronictl_bin, etcd_bin and py, installing what is missing.
find_software() {
  local missing=()
  bindir=$(find_bindir)
  [ -n "$bindir" ] || missing+=(postgresql postgresql-contrib)
  command -v patroni >/dev/null 2>&1 && command -v patronictl >/dev/null 2>&1 || missing+=(patroni)
  command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
  if [ ${#missing[@]} -eq 0 ] && ! "$(patroni_python)" -c 'import etcd, psycopg2' 2>/dev/null; then
    missing+=(python3-etcd python3-psycopg2)
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    apt_install "${missing[@]}"
    bindir=$(find_bindir)
  fi
  [ -n "$bindir" ] || refuse "could not find or install PostgreSQL server binaries"
  patroni_bin=$(command -v patroni) || refuse "could not find or install patroni"
  patronictl_bin=$(command -v patronictl) || refuse "could not find or install patronictl"
  etcd_bin=$(command -v etcd) || refuse "could not find or install etcd"
  py=$(patroni_python)
  "$py" -c 'import etcd, psycopg2' 2>/dev/null || refuse "$py lacks python3-etcd or python3-psycopg2, which Patroni needs"
}

# secret NAME: the password kept in $base/NAME.password, read by the server's user.
secret() {
  run_as head -n 1 -- "$base/$1.password" 2>/dev/null || true
}

make_passwords() {
  local name
  for name in admin replication restapi etcd; do
    if ! run_as test -s "$base/$name.password"; then new_password | put "$base/$name.password" 0600; fi
  done
}

admin_url() {
  local pw
  pw=$(secret admin)
  [ -n "$pw" ] || refuse "no admin password in $base/admin.password yet: run scripts/ha-cluster.sh start"
  echo "postgres://postgres:$pw@127.0.0.1:$(pg_port node1),127.0.0.1:$(pg_port node2)/postgres?target_session_attrs=read-write"
}

# patroni_config NODE: its configuration (with the passwords: mode 0600).
patroni_config() {
  local node=$1 dir=$base/$1 sync=false
  [ "$replication" = sync ] && sync=true
  cat <<EOF
# scripts/ha-cluster.sh writes this file at every start.
scope: $scope
namespace: /webhook-ha/
name: $node
log:
  level: INFO
  format: '%(asctime)s %(levelname)s: %(message)s'
restapi:
  listen: 127.0.0.1:$(api_port "$node")
  connect_address: 127.0.0.1:$(api_port "$node")
  authentication:
    username: patroni
    password: '$(secret restapi)'
etcd3:
  hosts: 127.0.0.1:$etcd_port
  protocol: http
  username: root
  password: '$(secret etcd)'
bootstrap:
  # The cluster-wide (dynamic) configuration, stored in etcd when the
  # cluster is made; start switches synchronous_mode with PATCH /config.
  dcs:
    ttl: $ttl
    loop_wait: $loop_wait
    retry_timeout: $retry_timeout
    maximum_lag_on_failover: $max_lag
    primary_start_timeout: 0
    synchronous_mode: $sync
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_log_hints: 'on'
        synchronous_commit: 'on'
        max_connections: 300
        shared_buffers: 128MB
        max_wal_size: 1GB
        log_min_messages: warning
        password_encryption: scram-sha-256
  initdb:
    - encoding: UTF8
    - locale: C.UTF-8
    - auth-local: trust
    - auth-host: scram-sha-256
postgresql:
  listen: 127.0.0.1:$(pg_port "$node")
  connect_address: 127.0.0.1:$(pg_port "$node")
  data_dir: $dir/data
  bin_dir: $bindir
  pgpass: $dir/pgpass
  use_unix_socket: true
  # The old primary rejoins by pg_rewind; if that fails, by a fresh copy.
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  authentication:
    superuser:
      username: postgres
      password: '$(secret admin)'
    replication:
      username: replicator
      password: '$(secret replication)'
  parameters:
    unix_socket_directories: '$dir'
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 scram-sha-256
    - local replication all trust
    - host replication replicator 127.0.0.1/32 scram-sha-256
watchdog:
  mode: 'off'
  # Else Patroni warns at every loop that a ttl this short leaves no room for one.
  safety_margin: -1
EOF
}

# The helper that speaks HTTP to Patroni's REST APIs and etcd, run as the
# server's user (it reads the password files itself: none is in an argv).
read -r -d '' helper <<'PY' || true
import json, sys, time, urllib.error, urllib.request, base64

def call(url, body=None, method=None, headers=None, timeout=2):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header('Content-Type', 'application/json')
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b'null')
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b'null')
        except ValueError:
            return e.code, None
    except (OSError, ValueError):
        return None, None

def api(port, path):
    return call('http://127.0.0.1:%s%s' % (port, path))

cmd, args = sys.argv[1], sys.argv[2:]
if cmd == 'members':
    # members API_PORT...: `name role state` of each member, from the first API that answers.
    for port in args:
        status, body = api(port, '/cluster')
        if status == 200 and body:
            for m in body.get('members', []):
                print(m['name'], m.get('role', '-'), m.get('state', '-') or '-')
            sys.exit(0)
    sys.exit(1)
elif cmd == 'primary':
    # primary NAME:API_PORT...: the member that holds the leader key and runs as a primary.
    for arg in args:
        name, port = arg.split(':')
        status, body = api(port, '/primary')
        if status == 200 and body and body.get('role') in ('master', 'primary') \
                and body.get('state') == 'running':
            print(name)
            sys.exit(0)
    sys.exit(3)
elif cmd == 'mode':
    # mode API_PORT...: sync or async, as the dynamic configuration says.
    for port in args:
        status, body = api(port, '/config')
        if status == 200 and body is not None:
            print('sync' if body.get('synchronous_mode') else 'async')
            sys.exit(0)
    sys.exit(1)
elif cmd == 'set-mode':
    # set-mode PASSWORD_FILE sync|async API_PORT...
    password = open(args[0]).readline().strip()
    auth = base64.b64encode(('patroni:' + password).encode()).decode()
    for port in args[2:]:
        status, _ = call('http://127.0.0.1:%s/config' % port, {'synchronous_mode': args[1] == 'sync'},
                         method='PATCH', headers={'Authorization': 'Basic ' + auth}, timeout=5)
        if status == 200:
            sys.exit(0)
    sys.exit(1)
elif cmd == 'etcd-auth':
    # etcd-auth PORT PASSWORD_FILE: user root (role root) with that password, then authentication on.
    port, password = args[0], open(args[1]).readline().strip()
    url = 'http://127.0.0.1:%s/v3/auth/' % port
    status, body = call(url + 'authenticate', {'name': 'root', 'password': password})
    if status == 200 and body and body.get('token'):
        sys.exit(0)  # already on
    for path, body in (('role/add', {'name': 'root'}),
                       ('user/add', {'name': 'root', 'password': password}),
                       ('user/grant', {'user': 'root', 'role': 'root'}),
                       ('enable', {})):
        status, answer = call(url + path, body, timeout=10)
        if status != 200 and 'already exists' not in json.dumps(answer):
            print('etcd %s: %s %s' % (path, status, answer), file=sys.stderr)
            sys.exit(1)
    status, body = call(url + 'authenticate', {'name': 'root', 'password': password})
    sys.exit(0 if status == 200 and body and body.get('token') else 1)
elif cmd == 'etcd-up':
    # etcd-up PORT: etcd answers and has a leader.
    status, body = call('http://127.0.0.1:%s/v3/maintenance/status' % args[0], {})
    sys.exit(0 if status == 200 and body and int(body.get('leader') or 0) != 0 else 1)
sys.exit(2)
PY

hp() { run_as "$py" -c "$helper" "$@"; }

# pid_of NAME: the pid in $base/NAME.pid when that process still runs from
# this folder (its command line names it); else fails.
pid_of() {
  local pid
  pid=$(run_as cat -- "$base/$1.pid" 2>/dev/null) || return 1
  case "$pid" in '' | *[!0-9]*) return 1 ;; esac
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$base/" || return 1
  echo "$pid"
}

# launch NAME LOG COMMAND...: COMMAND detached (own session, stdin from
# /dev/null, output to LOG, no descriptor of ours), run by the server's user
# from the folder; its pid in $base/NAME.pid.
launch() {
  local name=$1 logfile=$2
  shift 2
  # shellcheck disable=SC2016 # expanded by the inner bash
  run_as bash -c 'umask 077; cd "$1"; pidfile=$2; log=$3; shift 3; setsid "$@" </dev/null >>"$log" 2>&1 & echo $! >"$pidfile"' \
    launch "$base" "$base/$name.pid" "$logfile" "$@" 9>&-
}

show_log() {
  say "the last lines of $1:"
  run_as tail -n "${2:-40}" -- "$1" >&2 2>/dev/null || true
}

start_etcd() {
  if ! pid_of etcd >/dev/null; then
    run_as mkdir -p -m 0700 -- "$base/etcd"
    launch etcd "$base/etcd.log" "$etcd_bin" --name ha --data-dir "$base/etcd" \
      --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
      --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
      --initial-cluster "ha=http://127.0.0.1:$etcd_peer_port" --initial-cluster-state new \
      --initial-cluster-token "$scope" --auto-compaction-mode revision --auto-compaction-retention 1000 \
      --snapshot-count 10000 --logger zap --log-outputs stderr --log-level warn
  fi
  local deadline=$((SECONDS + 30))
  until hp etcd-up "$etcd_port"; do
    if ! pid_of etcd >/dev/null || ((SECONDS >= deadline)); then
      say "etcd did not start on 127.0.0.1:$etcd_port"; show_log "$base/etcd.log"; exit 1
    fi
    sleep 0.2
  done
  hp etcd-auth "$etcd_port" "$base/etcd.password" \
    || { say "could not turn etcd's authentication on"; show_log "$base/etcd.log"; exit 1; }
}

start_node() {
  local node=$1
  pid_of "$node" >/dev/null && return 0
  run_as mkdir -p -m 0700 -- "$base/$node"
  run_as chmod 0700 -- "$base/$node"
  launch "$node" "$base/$node/patroni.log" "$patroni_bin" "$base/$node/patroni.yml"
}

api_args() {
  local node
  for node in "${nodes[@]}"; do printf '%s:%s\n' "$node" "$(api_port "$node")"; done
}

# The name of the node that holds the leader key and runs as a primary.
leader() {
  local args
  mapfile -t args < <(api_args)
  hp primary "${args[@]}"
}

# psql_on NODE SQL: one line of unaligned output, over the node's socket.
psql_on() {
  run_as "$bindir/psql" -X -A -t -q -F '|' -h "$base/$1" -p "$(pg_port "$1")" -U postgres -d postgres -c "$2" 2>/dev/null
}

# Succeeds when a node is the primary and the other streams from it as its
# synchronous standby (sync) or as an asynchronous one with no synchronous
# standby named (async); $why says what is missing.
ready() {
  local mode=$1 lead other state role
  why="no leader"
  lead=$(leader) || return 1
  for other in "${nodes[@]}"; do [ "$other" = "$lead" ] || break; done
  why="$other is not streaming from $lead"
  state=$(psql_on "$lead" "SELECT coalesce((SELECT sync_state FROM pg_catalog.pg_stat_replication
      WHERE application_name = '$other' AND state = 'streaming' LIMIT 1), 'none')
      || '|' || current_setting('synchronous_standby_names')") || return 1
  [ "${state%%|*}" != none ] || return 1
  [ "$mode" != any ] || return 0
  role=$(hp members "$(api_port "$lead")" | awk -v n="$other" '$1 == n { print $2 }')
  why="$mode replication is not in force yet ($other: $role, ${state%%|*}; synchronous_standby_names '${state#*|}')"
  if [ "$mode" = sync ]; then
    [ "${state%%|*}" = sync ] && [ "$role" = sync_standby ]
  else
    [ "${state%%|*}" = async ] && [ -z "${state#*|}" ] && [ "$role" = replica ]
  fi
}

wait_ready() {
  local mode=$1 timeout=$2 node deadline
  deadline=$((SECONDS + timeout))
  until ready "$mode"; do
    for node in "${nodes[@]}"; do
      pid_of "$node" >/dev/null || { say "Patroni of $node exited"; show_log "$base/$node/patroni.log"; exit 1; }
    done
    if ((SECONDS >= deadline)); then
      say "the cluster was not ready within ${timeout}s: $why"
      for node in "${nodes[@]}"; do show_log "$base/$node/patroni.log" 25; done
      show_log "$base/etcd.log" 10
      exit 1
    fi
    sleep 0.3
  done
}

start() {
  find_software
  pick_user
  make_base
  # Concurrent callers wait for one another here.
  exec 9<"$base"
  flock 9
  make_passwords
  local node args current
  for node in "${nodes[@]}"; do
    run_as mkdir -p -m 0700 -- "$base/$node"
    patroni_config "$node" | put "$base/$node/patroni.yml" 0600
  done
  start_etcd
  if ! run_as test -f "$base/node1/data/PG_VERSION"; then
    say "creating a $replication cluster in $base (ports $port..$((port + 5)), user $pg_user)"
  fi
  for node in "${nodes[@]}"; do start_node "$node"; done
  # A primary and a streaming standby (the first time: initdb, then a copy).
  wait_ready any 180
  mapfile -t args < <(for node in "${nodes[@]}"; do api_port "$node"; done)
  current=$(hp mode "${args[@]}") || current=unknown
  if [ "$current" != "$replication" ]; then
    say "switching the cluster from $current to $replication replication"
    hp set-mode "$base/restapi.password" "$replication" "${args[@]}" \
      || refuse "could not set synchronous_mode through Patroni's REST API"
  fi
  wait_ready "$replication" 60
  admin_url
}

# Pids of the processes working from the folder (Postgres's from its data
# directory, etcd and Patroni from the folder): none after stop.
leftovers() {
  local d cwd
  for d in /proc/[0-9]*; do
    cwd=$(readlink -- "$d/cwd" 2>/dev/null) || continue
    case "$cwd" in "$base" | "$base"/*) echo "${d#/proc/}" ;; esac
  done
}

# wait_gone PID SECONDS
wait_gone() {
  local deadline=$((SECONDS + $2))
  while [ -d "/proc/$1" ] && ((SECONDS < deadline)); do sleep 0.1; done
  [ ! -d "/proc/$1" ]
}

# postgres_running NODE: its postmaster runs.
postgres_running() {
  run_as test -f "$base/$1/data/postmaster.pid" \
    && run_as "$bindir/pg_ctl" -D "$base/$1/data" status >/dev/null 2>&1
}

# stop_nodes NODE...: SIGTERM to their Patroni agents (each stops its
# Postgres, fast), then waits for them to exit; an agent that does not
# within 60 s is killed, and its Postgres stopped by pg_ctl.
stop_nodes() {
  local node pid
  for node in "$@"; do
    if pid=$(pid_of "$node"); then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  for node in "$@"; do
    pid=$(pid_of "$node") || continue
    if ! wait_gone "$pid" 60; then
      say "Patroni of $node did not stop within 60s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
      wait_gone "$pid" 5 || true
    fi
  done
  for node in "$@"; do
    if postgres_running "$node"; then
      run_as "$bindir/pg_ctl" -D "$base/$node/data" -m fast -w -t 30 stop >/dev/null 2>&1 9>&- || true
    fi
  done
}

stop() {
  pick_user
  exists || return 0
  check_base
  bindir=$(find_bindir)
  py=$(patroni_python 2>/dev/null || command -v python3)
  exec 9<"$base"
  flock 9
  local lead node pid pids standbys=() deadline
  lead=$(leader 2>/dev/null) || lead=""
  for node in "${nodes[@]}"; do [ "$node" = "$lead" ] || standbys+=("$node"); done
  # The standby first, so that the primary's going does not promote it; the
  # primary once the standby's Postgres is down (its agent takes a few more
  # seconds to exit).
  for node in "${standbys[@]}"; do
    if pid=$(pid_of "$node"); then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  deadline=$((SECONDS + 60))
  for node in "${standbys[@]}"; do
    while postgres_running "$node" && pid_of "$node" >/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  done
  if [ -n "$lead" ]; then stop_nodes "$lead" "${standbys[@]}"; else stop_nodes "${standbys[@]}"; fi
  if pid=$(pid_of etcd); then
    kill -TERM "$pid" 2>/dev/null || true
    wait_gone "$pid" 20 || kill -KILL "$pid" 2>/dev/null || true
  fi
  # Anything still working from the folder: orphaned backends of a killed
  # postmaster, say.
  mapfile -t pids < <(leftovers)
  if [ ${#pids[@]} -gt 0 ]; then
    kill -TERM "${pids[@]}" 2>/dev/null || true
    sleep 1
    mapfile -t pids < <(leftovers)
    [ ${#pids[@]} -eq 0 ] || kill -KILL "${pids[@]}" 2>/dev/null || true
    sleep 0.2
  fi
  mapfile -t pids < <(leftovers)
  [ ${#pids[@]} -eq 0 ] || refuse "still running from $base after stop: ${pids[*]}"
  say "stopped the cluster in $base"
}

destroy() {
  stop
  exists || return 0
  pick_user
  check_base
  rm -rf --one-file-system -- "$base"
  say "removed $base"
}

primary() {
  pick_user
  exists || refuse "no cluster in $base yet: run scripts/ha-cluster.sh start"
  check_base
  py=$(patroni_python)
  local lead pid
  lead=$(leader) || { say "no primary"; exit 3; }
  pid=$(run_as head -n 1 -- "$base/$lead/data/postmaster.pid" 2>/dev/null) || pid=""
  case "$pid" in '' | *[!0-9]*) say "no postmaster.pid for $lead"; exit 3 ;; esac
  echo "$lead $(pg_port "$lead") $pid"
}

status() {
  pick_user
  exists || { echo "no cluster ($base)"; exit 3; }
  check_base
  bindir=$(find_bindir)
  py=$(patroni_python)
  patronictl_bin=$(command -v patronictl)
  if ! pid_of etcd >/dev/null; then echo "stopped ($base)"; exit 3; fi
  run_as "$patronictl_bin" -c "$base/node1/patroni.yml" list 2>&1 </dev/null || true
  local args lead mode names
  mapfile -t args < <(for node in "${nodes[@]}"; do api_port "$node"; done)
  mode=$(hp mode "${args[@]}") || mode=unknown
  if lead=$(leader); then
    names=$(psql_on "$lead" "SHOW synchronous_standby_names") || names="?"
    echo "replication: $mode (synchronous_mode $([ "$mode" = sync ] && echo true || echo false); on the primary $lead synchronous_standby_names = '$names')"
  else
    echo "replication: $mode (no primary)"
  fi
  echo "admin: postgres://postgres@127.0.0.1:$(pg_port node1),127.0.0.1:$(pg_port node2)/postgres?target_session_attrs=read-write"
}

url() {
  pick_user
  exists || refuse "no cluster in $base yet: run scripts/ha-cluster.sh start"
  check_base
  admin_url
}

case "${1:-start}" in
  start) start ;;
  url) url ;;
  primary) primary ;;
  status) status ;;
  stop) stop ;;
  destroy) destroy ;;
  *) echo "usage: $0 start|url|primary|status|stop|destroy" >&2; exit 2 ;;
esac
