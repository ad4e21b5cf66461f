#!/usr/bin/env bash
# `make run`: the incident replayed on loopback: Postgres (a throwaway cluster unless
# DATABASE_URL is set), the simulated downstream APIs, webhook-ingest and outbox-relay; a
# provider sending duplicates and bursts; a carrier slower than the provider's timeout (the
# trigger), then a database stall that makes the provider retry requests that had succeeded
# (the mechanism). Then `simulator audit`: RESULT: FAILED and exit 1 unless every command
# had exactly one effect and every per-order rule held. Its environment is below.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${BIN_DIR:-target/release}
events=${RUN_EVENTS:-3000}
rate=${RUN_RATE:-150} # events/s, open loop
dup=${RUN_DUPLICATE_RATE:-0.1}
carrier=${RUN_CARRIER_LATENCY_MS:-p50:1500,p99:4000}
degraded=${RUN_DEGRADED_SECS:-10}
stall=${RUN_STALL_SECS:-2} # 0: none
dir=${RUN_DIR:-target/run} # logs and JSON
keep=${RUN_KEEP:-0} # 1: serve after the audit, until Ctrl-C
ingest_addr=${INGEST_LISTEN_ADDR:-127.0.0.1:8080}
ingest_admin=${ADMIN_LISTEN_ADDR:-127.0.0.1:9090}
relay_admin=${RELAY_ADMIN_LISTEN_ADDR:-127.0.0.1:9091}
lease=10
secret=whsec_ZGVtby1vbmx5LXNlY3JldC1kby1ub3QtdXNl
say() { printf '[run] %s\n' "$*" >&2; }

mkdir -p "$dir"
rm -f "$dir"/*.log "$dir"/acks.jsonl "$dir"/audit.json "$dir"/provider.json

pids=()
cleanup() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap 'say "interrupted: stopping everything"; cleanup; exit 130' INT TERM
trap cleanup EXIT

# wait_for NAME LOG COMMAND...: until COMMAND succeeds; 30 s, as a loaded machine starts slowly.
wait_for() {
  for _ in $(seq 300); do "${@:3}" && return; sleep 0.1; done
  say "$1 did not start; its log:"
  tail -n 20 "$2" >&2
  exit 1
}

if [ -z "${DATABASE_URL:-}" ]; then
  admin=$(scripts/pg-cluster.sh start)
  psql "$admin" -qc "DROP DATABASE IF EXISTS webhook_demo WITH (FORCE)" -c "CREATE DATABASE webhook_demo"
  export DATABASE_URL=${admin%/postgres}/webhook_demo
  say "Postgres: the throwaway cluster's database webhook_demo (scripts/pg-cluster.sh status)"
fi

"$bin/webhook-ingest" migrate
seed_orders() {
  psql "$DATABASE_URL" -qc "INSERT INTO orders (id, payment_id)
    SELECT n, 'pay_' || n FROM generate_series($1, $2) n ON CONFLICT DO NOTHING"
}
seed_orders 1 "$events"
say "seeded orders pay_1 .. pay_$events"

"$bin/simulator" downstream --listen 127.0.0.1:0 >"$dir/downstream.out" 2>"$dir/downstream.log" &
pids+=($!)
wait_for downstream "$dir/downstream.log" test -s "$dir/downstream.out"
downstream=http://$(sed -n 's/.*"listening":"\([^"]*\)".*/\1/p' "$dir/downstream.out" | head -1)
say "downstream APIs (fulfilment, email) on $downstream"

WEBHOOK_SECRETS=$secret INGEST_LISTEN_ADDR=$ingest_addr ADMIN_LISTEN_ADDR=$ingest_admin \
  "$bin/webhook-ingest" >"$dir/ingest.log" 2>&1 &
pids+=($!)
# A relay tuned for a demo: short timeouts and backoff, so retries show within the run.
FULFILMENT_URL=$downstream EMAIL_URL=$downstream ADMIN_LISTEN_ADDR=$relay_admin \
  RELAY_LEASE_SECS=$lease RELAY_HTTP_TIMEOUT_MS=2000 RELAY_BACKOFF_BASE_MS=200 RELAY_BACKOFF_MAX_SECS=5 \
  "$bin/outbox-relay" >"$dir/relay.log" 2>&1 &
pids+=($!)
wait_for webhook-ingest "$dir/ingest.log" curl -sf -o /dev/null "http://$ingest_admin/readyz"
wait_for outbox-relay "$dir/relay.log" curl -sf -o /dev/null "http://$relay_admin/readyz"
say "webhook-ingest on http://$ingest_addr, outbox-relay running (logs in $dir)"

# The timeline, beside the provider's load: the fraction $1 of the way, in seconds.
at() { awk -v f="$1" -v e="$events" -v r="$rate" 'BEGIN { printf "%.1f", e / r * f }'; }
(
  sleep "$(at 0.25)"
  say "carrier degraded: latency $carrier, above the provider's 1 s timeout (the incident's trigger)"
  curl -sf -X POST "$downstream/control/faults" -H 'content-type: application/json' \
    -d "{\"latency_ms\": \"$carrier\"}" >/dev/null
  sleep "$degraded"
  curl -sf -X POST "$downstream/control/faults" -H 'content-type: application/json' -d '{}' >/dev/null
  say "carrier recovered"
) &
pids+=($!)
(
  sleep "$(at 0.4)"
  [ "$stall" != 0 ] || exit 0
  say "database stall for ${stall}s: the ingest answers later than the provider waits; the provider retries"
  psql "$DATABASE_URL" -qc "BEGIN; LOCK TABLE orders IN EXCLUSIVE MODE; SELECT pg_sleep($stall); COMMIT;" >/dev/null
  say "database back"
) &
pids+=($!)

say "provider: $events events at $rate/s, ${dup} duplicates, bursts, refunds, a 1 s timeout with retries"
"$bin/simulator" provider --target "http://$ingest_addr" --secret "$secret" \
  --rate "$rate" --events "$events" --orders "$events" \
  --duplicate-rate "$dup" --late-duplicate-rate 0.2 --late-delay-ms 1000 \
  --burst-rate 0.02 --burst-size 5 --refund-rate 0.02 --unmatched-rate 0.01 --unknown-rate 0.01 \
  --timeout-ms 1000 --give-up-after-ms 60000 --ack-file "$dir/acks.jsonl" --json >"$dir/provider.json" \
  || say "the provider did not get a 2xx for every event (exit $?)"

say "waiting for the relay to drain the outbox"
for _ in $(seq 600); do
  [ "$(psql "$DATABASE_URL" -tAc "SELECT count(*) FROM outbox WHERE status = 'pending'")" = 0 ] && break
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
import json, os, sys
provider = json.load(open(sys.argv[2]))
audit = json.load(open(sys.argv[1])) if os.path.exists(sys.argv[1]) else None
events, acked = provider["events"], provider["acknowledged"]
problems = [] if acked == events else [f"{events - acked} events never acknowledged"]
print(f"provider: {events} events, "
      + ("every one acknowledged" if acked == events else f"{acked} of them acknowledged")
      + f"; {provider['deliveries']} deliveries ({provider['duplicate_deliveries']} sent as duplicates, "
      f"{provider['burst_deliveries']} in bursts, {provider['retries']} retries)")
if audit is None:
    problems.append(f"the audit did not run (simulator audit exit {sys.argv[3]})")
else:
    # Double effects are among exactly_once's problems (the same downstream counter).
    problems += audit["exactly_once"]["problems"]
    problems += [f"{f['count']} {f['title']} (orders {' '.join(map(str, f['examples']))})"
                 for f in audit["findings"] if f["count"] and f["rule"] != "double_effects"]
    # A refused delivery (4xx, 5xx) writes no row; one the provider stopped waiting for may have.
    answers = {int(code): n for code, n in provider["status_counts"].items()}
    received = audit["deliveries"]
    late = received - sum(n for code, n in answers.items() if 200 <= code < 300)
    refused = sum(n for code, n in answers.items() if code >= 300) + provider["connection_errors"]
    rows = [("sent by the provider", provider["deliveries"]),
            ("answered 4xx or 5xx, or unconnected", -refused),
            ("timed out at the provider", -provider["timeouts"]),
            ("  of which the ingest recorded", late),
            ("received by the database", received)]
    print("deliveries, the provider's count against the database's:")
    for label, n in rows:
        print(f"  {label:<36} {n:>8,}")
    if not 0 <= late <= provider["timeouts"]:
        problems.append(f"the database received {received} deliveries, which the provider's answers do not explain")
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
