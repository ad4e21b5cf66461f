#!/usr/bin/env bash
# A throwaway high-availability PostgreSQL for `make failover`: Patroni, a
# one-member etcd and two Postgres nodes on 127.0.0.1, from Debian's packages.
#
#   scripts/ha-cluster.sh start    # create (first time) and start; prints the admin URL
#   scripts/ha-cluster.sh primary  # `<name> <port> <postmaster pid>` of the leader (exit 3: none)
#   scripts/ha-cluster.sh status   # `patronictl list` and the replication mode (exit 3: stopped)
#   scripts/ha-cluster.sh stop     # both agents (and their Postgres), then etcd; the data stays
#   scripts/ha-cluster.sh destroy  # stop, then remove the folder
#
# - The URL names both nodes (libpq's multi-host form, target_session_attrs=read-write):
#   a new connection finds the primary, with no proxy nor virtual IP.
# - HA_CLUSTER_REPLICATION=sync (default) is Patroni's synchronous_mode: a commit waits
#   for the standby, and only it may be promoted; async promotes it however far behind.
#   `start` with the other mode switches the cluster and waits until it holds.
# - loop_wait 1, retry_timeout 2 (with 1 no standby ever takes the leader key), ttl 5
#   (>= loop_wait + 2 x retry_timeout; Debian's Patroni 3.0.2 takes them unclamped).
#   primary_start_timeout 0: a crashed primary is not restarted in place; the standby is
#   promoted, and the old primary rejoins as its standby (pg_rewind, else a fresh copy).
# - Security as pg-cluster.sh's, in /tmp/webhook-ha-<key> (HA_CLUSTER_DIR); random passwords
#   for the superuser, replication, the REST API and etcd's root (no one else rewrites the DCS).
# - Ports from HA_CLUSTER_PORT: +0 etcd, +1 its peers, +2/+3 Postgres, +4/+5 REST APIs.
set -euo pipefail

say() { printf 'ha-cluster: %s\n' "$*" >&2; }
# shellcheck source=scripts/cluster-common.sh
. "$(dirname "$0")/cluster-common.sh"

key=$(checkout_key)
base=${HA_CLUSTER_DIR:-/tmp/webhook-ha-$key}
base=${base%/}
port=${HA_CLUSTER_PORT:-$((30000 + 0x${key:0:4} % 460 * 6))}
replication=${HA_CLUSTER_REPLICATION:-sync}
[[ $replication =~ ^(sync|async)$ ]] || { say "HA_CLUSTER_REPLICATION: sync or async"; exit 2; }
synchronous_mode=$([ "$replication" = sync ] && echo true || echo false)
nodes=(node1 node2)
pg_port() { echo $((port + 1 + ${1#node})); }
api_port() { echo $((port + 3 + ${1#node})); }
hosts=127.0.0.1:$(pg_port node1),127.0.0.1:$(pg_port node2)

find_software() {
  command -v patronictl >/dev/null && command -v etcd >/dev/null && [ -n "$(find_bindir)" ] \
    || apt_install postgresql postgresql-contrib patroni etcd-server
  bindir=$(find_bindir)
  [ -x "$bindir/pg_rewind" ] || refuse "could not find or install PostgreSQL's pg_rewind"
}

# patroni_config NODE: its configuration (with the passwords: mode 0600).
patroni_config() {
  cat <<YAML
scope: webhook-ha-$port
name: $1
restapi:
  listen: 127.0.0.1:$(api_port "$1")
  connect_address: 127.0.0.1:$(api_port "$1")
  authentication: {username: patroni, password: '$(secret restapi.password)'}
etcd3: {hosts: '127.0.0.1:$port', username: root, password: '$(secret etcd.password)'}
bootstrap:
  dcs:
    ttl: 5
    loop_wait: 1
    retry_timeout: 2
    maximum_lag_on_failover: 1099511627776
    primary_start_timeout: 0
    synchronous_mode: $synchronous_mode
    postgresql: {use_pg_rewind: true, parameters: {max_connections: 300}}
  initdb: [{encoding: UTF8}, {locale: C.UTF-8}, {auth-local: trust}, {auth-host: scram-sha-256}]
postgresql:
  listen: 127.0.0.1:$(pg_port "$1")
  connect_address: 127.0.0.1:$(pg_port "$1")
  data_dir: $base/$1/data
  bin_dir: $bindir
  pgpass: $base/$1/pgpass
  use_unix_socket: true
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  authentication:
    superuser: {username: postgres, password: '$(secret admin.password)'}
    replication: {username: replicator, password: '$(secret replication.password)'}
  parameters: {unix_socket_directories: '$base/$1'}
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 scram-sha-256
    - host replication replicator 127.0.0.1/32 scram-sha-256
# safety_margin -1: else Patroni warns at every loop that so short a ttl leaves no room for a watchdog.
watchdog: {mode: 'off', safety_margin: -1}
YAML
}

# patronictl, as the server's user, with node1's configuration (etcd's password in it).
ctl() { run_as patronictl -c "$base/node1/patroni.yml" "$@" </dev/null; }
# api NODE PATH: the body of Patroni's REST answer (fails unless 200).
api() { curl -sf --max-time 2 "http://127.0.0.1:$(api_port "$1")$2"; }
# etcd_call PATH: a request to etcd's JSON gateway, its body on stdin.
etcd_call() { curl -sf --max-time 10 -X POST --data-binary @- "http://127.0.0.1:$port/v3/$1"; }

etcd_up() {
  why="etcd does not answer on 127.0.0.1:$port"
  [[ $(etcd_call maintenance/status <<<'{}') == *'"leader":"'[1-9]* ]]
}

# etcd's user root (role root) with etcd.password, then authentication on.
etcd_auth() {
  local user
  user=$(printf '{"name": "root", "password": "%s"}' "$(secret etcd.password)")
  # Each refused once authentication is on.
  etcd_call auth/role/add <<<'{"name": "root"}' >/dev/null || true
  etcd_call auth/user/add <<<"$user" >/dev/null || true
  etcd_call auth/user/grant <<<'{"user": "root", "role": "root"}' >/dev/null || true
  etcd_call auth/enable <<<'{}' >/dev/null || true
  [[ $(etcd_call auth/authenticate <<<"$user") == *'"token"'* ]] || fail "could not turn etcd's authentication on"
}

# pid_of NAME: the pid in $base/NAME.pid if it still runs from this folder.
pid_of() {
  local pid
  pid=$(run_as cat -- "$base/$1.pid" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "$base/" || return 1
  echo "$pid"
}

# launch NAME LOG COMMAND...: COMMAND detached (setsid, no descriptor of ours: a caller
# reading our output never waits on it), run by the server's user from the folder.
launch() {
  run_as bash -c 'umask 077; cd "$1"; pidfile=$2; log=$3; shift 3
    setsid "$@" </dev/null >>"$log" 2>&1 & echo $! >"$pidfile"' launch "$base" "$base/$1.pid" "$2" "${@:3}" 9>&-
}

fail() {
  say "$*; the logs' last lines:"
  run_as tail -n 25 -- "$base"/{etcd.log,node1/patroni.log,node2/patroni.log} >&2 || true
  exit 1
}

# wait_for SECONDS COMMAND...: until COMMAND succeeds; fails, saying $why,
# after SECONDS or once a daemon in $started has exited.
wait_for() {
  local deadline=$((SECONDS + $1)) name
  until "${@:2}"; do
    for name in "${started[@]}"; do pid_of "$name" >/dev/null || fail "$name exited"; done
    ((SECONDS < deadline)) || fail "not ready within ${1}s: $why"
    sleep 0.3
  done
}

# The node that holds the leader key and runs as a primary (its Patroni says).
leader() {
  local node body
  for node in "${nodes[@]}"; do
    body=$(api "$node" /primary) || continue
    if [[ $body == *'"state": "running"'* && $body =~ \"role\":\ \"(master|primary)\" ]]; then
      echo "$node"
      return
    fi
  done
  return 3
}

# ready MODE: a node is the primary and the other streams from it: as its
# synchronous standby (sync), an asynchronous one (async), or either (any).
ready() {
  local lead other=node1 state
  why="no primary"
  lead=$(leader) || return 1
  [ "$lead" != node1 ] || other=node2
  why="$other does not stream from $lead"
  state=$(run_as "$bindir/psql" -X -Atq -h "$base/$lead" -p "$(pg_port "$lead")" -U postgres \
    -c "SELECT sync_state FROM pg_stat_replication
        WHERE application_name = '$other' AND state = 'streaming' LIMIT 1" 2>/dev/null) || return 1
  [ -n "$state" ] || return 1
  why="$1 replication is not in force yet ($other: $state)"
  [ "$1" = any ] || { [ "$state" = "$1" ] && api "$other" "/$1" >/dev/null; }
}

# sync or async, as the dynamic configuration in etcd says.
mode() {
  ctl show-config 2>/dev/null | grep -x 'synchronous_mode: true' >/dev/null && echo sync || echo async
}

start() {
  find_software
  pick_user
  make_base
  lock_base
  local name node current peer=http://127.0.0.1:$((port + 1))
  for name in admin replication restapi etcd; do
    run_as test -s "$base/$name.password" || new_password | put "$base/$name.password" 0600
  done
  for node in "${nodes[@]}" etcd; do run_as mkdir -p -m 0700 -- "$base/$node"; done
  for node in "${nodes[@]}"; do patroni_config "$node" | put "$base/$node/patroni.yml" 0600; done
  if ! pid_of etcd >/dev/null; then
    launch etcd "$base/etcd.log" etcd --name ha --data-dir "$base/etcd" \
      --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
      --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" --initial-cluster "ha=$peer" \
      --logger zap --log-level warn
  fi
  started=(etcd)
  wait_for 30 etcd_up
  etcd_auth
  run_as test -f "$base/node1/data/PG_VERSION" \
    || say "creating a $replication cluster in $base (ports $port..$((port + 5)), user $pg_user)"
  for node in "${nodes[@]}"; do
    pid_of "$node" >/dev/null || launch "$node" "$base/$node/patroni.log" patroni "$base/$node/patroni.yml"
  done
  started=(etcd "${nodes[@]}")
  # A primary and a streaming standby (the first time: initdb, then a copy).
  wait_for 180 ready any
  current=$(mode)
  if [ "$current" != "$replication" ]; then
    say "switching the cluster from $current to $replication replication"
    ctl edit-config --force --quiet --set "synchronous_mode=$synchronous_mode" >/dev/null \
      || refuse "could not set synchronous_mode with patronictl edit-config"
  fi
  wait_for 60 ready "$replication"
  admin_url "$hosts" "?target_session_attrs=read-write"
}

# Pids of the processes working from the folder: none after stop.
leftovers() {
  find /proc/[0-9]*/cwd -maxdepth 0 \( -lname "$base" -o -lname "$base/*" \) 2>/dev/null | cut -d/ -f3
}

# stopped NAME: waits for the daemon to exit; kills it after 60 s.
stopped() {
  local pid
  pid=$(pid_of "$1") || return 0
  timeout 60 tail -s 0.1 --pid="$pid" -f /dev/null && return
  say "$1 did not stop within 60s; killing it"
  kill -KILL "$pid" 2>/dev/null || true
}

stop() {
  pick_user
  exists || return 0
  check_base
  lock_base
  local node pid pids signal
  # Both agents at once: each stops its Postgres (fast), and an agent told
  # to stop never promotes its standby.
  for node in "${nodes[@]}"; do
    if pid=$(pid_of "$node"); then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  for node in "${nodes[@]}"; do stopped "$node"; done
  if pid=$(pid_of etcd); then kill -TERM "$pid" 2>/dev/null || true; fi
  stopped etcd
  # Anything still working from the folder: the Postgres of a killed agent, the
  # backends of a killed postmaster.
  for signal in TERM KILL; do
    mapfile -t pids < <(leftovers)
    [ ${#pids[@]} -gt 0 ] || break
    kill "-$signal" "${pids[@]}" 2>/dev/null || true
    sleep 1
  done
  mapfile -t pids < <(leftovers)
  [ ${#pids[@]} -eq 0 ] || refuse "still running from $base after stop: ${pids[*]}"
  say "stopped the cluster in $base"
}

destroy() {
  exists || return 0
  check_base
  rm -rf --one-file-system -- "$base"
  say "removed $base"
}

primary() {
  existing_base
  local lead pid
  lead=$(leader) || { say "no primary"; exit 3; }
  pid=$(run_as head -n 1 -- "$base/$lead/data/postmaster.pid" 2>/dev/null) || true
  [[ $pid =~ ^[0-9]+$ ]] || { say "no postmaster.pid for $lead"; exit 3; }
  echo "$lead $(pg_port "$lead") $pid"
}

status() {
  pick_user
  exists && check_base && pid_of etcd >/dev/null || { echo "stopped ($base)"; exit 3; }
  ctl list 2>&1 || true
  echo "replication: $(mode)"
}

case "${1:-start}" in
  start) start ;;
  primary) primary ;;
  status) status ;;
  stop) stop ;;
  destroy) stop; destroy ;;
  *) echo "usage: $0 start|primary|status|stop|destroy" >&2; exit 2 ;;
esac
