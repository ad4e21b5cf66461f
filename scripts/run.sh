#!/usr/bin/env bash
# `make run`: the incident, replayed end to end on loopback. Postgres (a
# throwaway cluster unless DATABASE_URL is set), migrated and seeded with
# orders; the simulated downstream APIs, webhook-ingest and outbox-relay; a
# payment provider sending events with duplicates and bursts; a degraded
# carrier slower than the provider's timeout (the trigger), then a database
# stall that makes the provider retry requests that had succeeded (the
# mechanism). Ends with `simulator audit`, the downstream's records against
# the database in totals (every command had exactly one effect) and per
# order; RESULT: FAILED and exit 1 unless both hold.
#
# Environment: RUN_EVENTS=3000, RUN_RATE=150 (events/s, open loop),
# RUN_DUPLICATE_RATE=0.1, RUN_CARRIER_LATENCY_MS=p50:1500,p99:4000,
# RUN_DEGRADED_SECS=10, RUN_STALL_SECS=2 (0: none), RUN_DIR=target/run (logs
# and JSON), RUN_KEEP=1 (keep serving after the audit until Ctrl-C),
# BIN_DIR=target/release, INGEST_LISTEN_ADDR, ADMIN_LISTEN_ADDR (ingest),
# RELAY_ADMIN_LISTEN_ADDR.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${BIN_DIR:-target/release}
events=${RUN_EVENTS:-3000}
rate=${RUN_RATE:-150}
dup=${RUN_DUPLICATE_RATE:-0.1}
carrier=${RUN_CARRIER_LATENCY_MS:-p50:1500,p99:4000}
degraded=${RUN_DEGRADED_SECS:-10}
stall=${RUN_STALL_SECS:-2}
dir=${RUN_DIR:-target/run}
keep=${RUN_KEEP:-0}
lease=${RELAY_LEASE_SECS:-10}
ingest_addr=${INGEST_LISTEN_ADDR:-127.0.0.1:8080}
ingest_admin=${ADMIN_LISTEN_ADDR:-127.0.0.1:9090}
relay_admin=${RELAY_ADMIN_LISTEN_ADDR:-127.0.0.1:9091}
secret=${WEBHOOK_SECRETS:-whsec_ZGVtby1vbmx5LXNlY3JldC1kby1ub3QtdXNl}

for b in webhook-ingest outbox-relay simulator; do
  [ -x "$bin/$b" ] || { echo "run: $bin/$b is missing: run 'make release' (or set BIN_DIR)" >&2; exit 1; }
done
mkdir -p "$dir"
rm -f "$dir"/*.log "$dir"/acks.jsonl "$dir"/audit.json "$dir"/provider.json

# Bold only on a terminal, and not when NO_COLOR is set (no-color.org).
if [ -t 2 ] && [ -z "${NO_COLOR:-}" ]; then
  say() { printf '\033[1m[run]\033[0m %s\n' "$*" >&2; }
else
  say() { printf '[run] %s\n' "$*" >&2; }
fi

pids=()
# shellcheck disable=SC2317 # run by the traps
cleanup() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap 'say "interrupted: stopping everything"; cleanup; exit 130' INT TERM
trap cleanup EXIT

if [ -z "${DATABASE_URL:-}" ]; then
  admin=$(scripts/pg-cluster.sh start)
  psql "$admin" -qc "DROP DATABASE IF EXISTS webhook_demo WITH (FORCE)" -c "CREATE DATABASE webhook_demo"
  DATABASE_URL=${admin%/postgres}/webhook_demo
  # Shown without the admin password the URL carries.
  server=${admin#*@}
  say "Postgres: throwaway cluster, database webhook_demo (postgres://postgres@${server%/postgres})"
fi
export DATABASE_URL

"$bin/webhook-ingest" migrate
# Orders $1 .. $2, unpaid, with payment ids pay_$1 .. pay_$2.
seed_orders() {
  psql "$DATABASE_URL" -qc "INSERT INTO orders (id, payment_id)
    SELECT n, 'pay_' || n FROM generate_series($1, $2) n ON CONFLICT DO NOTHING"
}
seed_orders 1 "$events"
say "seeded orders pay_1 .. pay_$events"

"$bin/simulator" downstream --listen 127.0.0.1:0 >"$dir/downstream.out" 2>"$dir/downstream.log" &
pids+=($!)
# Generous: on a loaded machine (a build beside it) the first start can take seconds.
for _ in $(seq 600); do [ -s "$dir/downstream.out" ] && break; sleep 0.05; done
if [ ! -s "$dir/downstream.out" ]; then
  say "the downstream did not start; its log:"
  tail -n 20 "$dir/downstream.log" >&2
  exit 1
fi
downstream=http://$(sed -n 's/.*"listening":"\([^"]*\)".*/\1/p' "$dir/downstream.out" | head -1)
say "downstream APIs (fulfilment, email) on $downstream"

WEBHOOK_SECRETS=$secret INGEST_LISTEN_ADDR=$ingest_addr ADMIN_LISTEN_ADDR=$ingest_admin \
  "$bin/webhook-ingest" >"$dir/ingest.log" 2>&1 &
pids+=($!)
# A relay tuned for a demo: short timeouts and backoff, so retries show within the run.
FULFILMENT_URL=$downstream EMAIL_URL=$downstream ADMIN_LISTEN_ADDR=$relay_admin \
  RELAY_HTTP_TIMEOUT_MS=${RELAY_HTTP_TIMEOUT_MS:-2000} RELAY_LEASE_SECS=$lease \
  RELAY_BACKOFF_BASE_MS=${RELAY_BACKOFF_BASE_MS:-200} RELAY_BACKOFF_MAX_SECS=${RELAY_BACKOFF_MAX_SECS:-5} \
  "$bin/outbox-relay" >"$dir/relay.log" 2>&1 &
pids+=($!)

ready() {
  for _ in $(seq 200); do
    curl -sf "http://$1/readyz" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  say "$2 did not become ready; its log:"; tail -n 20 "$3" >&2; exit 1
}
ready "$ingest_admin" webhook-ingest "$dir/ingest.log"
ready "$relay_admin" outbox-relay "$dir/relay.log"
say "webhook-ingest on http://$ingest_addr, outbox-relay running (logs in $dir)"

# The timeline, beside the provider's load: a quarter, then 40 % of the way.
degrade_at=$(awk -v e="$events" -v r="$rate" 'BEGIN { printf "%.1f", e / r * 0.25 }')
stall_at=$(awk -v e="$events" -v r="$rate" 'BEGIN { printf "%.1f", e / r * 0.4 }')
(
  sleep "$degrade_at"
  say "carrier degraded: latency $carrier, above the provider's 1 s timeout (the incident's trigger)"
  curl -sf -X POST "$downstream/control/faults" -H 'content-type: application/json' \
    -d "{\"latency_ms\": \"$carrier\"}" >/dev/null
  sleep "$degraded"
  curl -sf -X POST "$downstream/control/faults" -H 'content-type: application/json' -d '{}' >/dev/null
  say "carrier recovered"
) &
pids+=($!)
if [ "$stall" != 0 ]; then
  (
    sleep "$stall_at"
    say "database stall for ${stall}s: the ingest answers later than the provider waits; the provider retries"
    psql "$DATABASE_URL" -qc "BEGIN; LOCK TABLE orders IN EXCLUSIVE MODE; SELECT pg_sleep($stall); COMMIT;" >/dev/null
    say "database back"
  ) &
  pids+=($!)
fi

say "provider: $events events at $rate/s, ${dup} duplicates, bursts, refunds, a 1 s timeout with retries"
provider_status=0
"$bin/simulator" provider --target "http://$ingest_addr" --secret "$secret" \
  --rate "$rate" --events "$events" --orders "$events" \
  --duplicate-rate "$dup" --late-duplicate-rate 0.2 --late-delay-ms 1000 \
  --burst-rate 0.02 --burst-size 5 --refund-rate 0.02 --unmatched-rate 0.01 --unknown-rate 0.01 \
  --timeout-ms 1000 --give-up-after-ms 60000 \
  --ack-file "$dir/acks.jsonl" --json >"$dir/provider.json" || provider_status=$?
[ "$provider_status" = 0 ] || say "the provider did not get a 2xx for every event (exit $provider_status)"

say "waiting for the relay to drain the outbox"
for _ in $(seq 600); do
  left=$(psql "$DATABASE_URL" -tAc "SELECT count(*) FROM outbox WHERE status = 'pending'")
  [ "$left" = 0 ] && break
  sleep 0.2
done

echo
# Only this run's events, commands and payments count: a reused DATABASE_URL
# holds older ones, which this downstream never saw.
audit_status=0
"$bin/simulator" audit --downstream "$downstream" --lease-secs "$lease" --since-secs "$((SECONDS + 60))" \
  --json-file "$dir/audit.json" || audit_status=$?
echo

result=0
python3 - "$dir/audit.json" "$dir/provider.json" "$audit_status" <<'PY' || result=$?
import json, sys
provider = json.load(open(sys.argv[2]))
try:
    audit = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    audit = None
events, acked = provider["events"], provider["acknowledged"]
problems = [] if acked == events else [f"{events - acked} events never acknowledged"]
if audit is None:
    problems.append(f"the audit did not run (simulator audit exit {sys.argv[3]})")
else:
    # Double effects are among exactly_once's problems (the same downstream counter).
    problems += audit["exactly_once"]["problems"]
    problems += [f"{f['count']} {f['title']} (orders {' '.join(map(str, f['examples']))})"
                 for f in audit["findings"] if f["count"] and f["rule"] != "double_effects"]
acked_text = "every one acknowledged" if acked == events else f"{acked} of them acknowledged"
print(f"provider: {events} events, {acked_text}; {provider['deliveries']} deliveries "
      f"({provider['duplicate_deliveries']} sent as duplicates, {provider['burst_deliveries']} in bursts, "
      f"{provider['retries']} retries)")
if audit is not None:
    # The provider's deliveries against the database's: a refused or shed
    # delivery writes no row; one the provider stopped waiting for may have.
    answers = {int(code): n for code, n in provider["status_counts"].items()}
    ok = sum(n for code, n in answers.items() if 200 <= code < 300)
    received, distinct = audit["deliveries"], audit["distinct_events"]
    late = received - ok
    rows = [("sent by the provider", provider["deliveries"], "")]
    rows += [(f"answered {code}", -n, "nothing recorded" + ": shed or past the deadline, retried" * (code == 503))
             for code, n in sorted(answers.items()) if code >= 300]
    if provider["connection_errors"]:
        rows.append(("connection errors", -provider["connection_errors"], "nothing recorded"))
    rows += [("timed out at the provider", -provider["timeouts"], ""),
             ("  of which the ingest recorded", late, "it finished after the provider stopped waiting"),
             ("received by the database", received, "every delivery that reached its event's row")]
    print("deliveries, the provider's count against the database's:")
    for label, n, why in rows:
        print(f"  {label:<32} {n:>8,}" + (f"  {why}" if why else ""))
    if not 0 <= late <= provider["timeouts"]:
        problems.append(f"the database received {received} deliveries, which the provider's answers do not explain")
    print(f"  the database's duplicates: {received - distinct:,} = {received:,} deliveries - {distinct:,} events "
          "(every delivery after an event's first: duplicates, burst copies and retries alike)")
if problems:
    print("RESULT: FAILED: " + "; ".join(problems))
    sys.exit(1)
print(f"RESULT: {audit['exactly_once']['summary']}; every per-order rule held")
PY

if [ "$keep" = 1 ]; then
  first=$((events + 1)) last=$((events + 100))
  seed_orders "$first" "$last"
  # Ctrl-C is how this run ends: stopped cleanly, the audit's result kept
  # (set before the hints, which a user or a test may answer at once).
  trap 'say "stopping everything"; cleanup; exit "$result"' INT TERM
  echo
  say "RUN_KEEP=1: still serving until Ctrl-C; orders pay_$first .. pay_$last are new and unpaid. Try:"
  cat >&2 <<HINTS
  export DATABASE_URL='$DATABASE_URL' INGEST=$ingest_addr DOWNSTREAM=${downstream#http://} \\
    PROVIDER_SECRET=$secret PATH=$bin:\$PATH
  PROVIDER_SECRET=$secret $bin/simulator send pay_$first --target http://$ingest_addr
  curl -s $downstream/stats         # requests and effects per idempotency key
  DATABASE_URL=$DATABASE_URL $bin/outbox-relay stats
  DATABASE_URL=$DATABASE_URL $bin/simulator audit --downstream $downstream --lease-secs $lease
  curl -s http://$ingest_admin/metrics     # the ingest's metrics (its /readyz beside)
  curl -s http://$relay_admin/metrics      # the relay's
HINTS
  while :; do sleep 3600 & pids+=($!); wait $!; done
fi
exit "$result"
