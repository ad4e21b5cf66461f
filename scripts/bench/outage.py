"""The `outage` phase (runner.PHASES; the method: docs/BENCHMARK.md): the
relay when a downstream outage ends and its commands are all due at once,
on top of the history the tables hold. Made with set-based SQL on
bench_product: six days of history (inside the 7-day retention, so the
relay's prune deletes none of it during the drain); the due rows as the
ingest writes them (payload {v, order_id, event_id}, key, trace context),
nine in ten tried before as the relay's backoff allows in their age; then
VACUUM ANALYZE and a CHECKPOINT (an hour of autovacuum would have seen to
the tables). The peer's no-op jobs (full runs) have no history to run on:
read them beside `relay_vs_peer`, not as a ratio of their own."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .config import CFG, OUTAGE_ORDER0, TRACEPARENT, BenchError, log
from .db import Product
from .fresh import drain_backlog
from .history import generate, history_events_sql, history_outbox_sql
from .peer import drain as peer_drain

if TYPE_CHECKING:
    from .runner import Bench

# The relay's error for each kind's call while its API was down.
REFUSED = ("connection failed: error sending request for url (http://downstream.internal/shipments): client error "
           "(Connect): tcp connect error: Connection refused (os error 111)")


def due_rows_sql(rows: int) -> str:
    """`rows` pending commands left by an hour-long outage, all due now."""
    orders = rows // 2
    return f"""
INSERT INTO outbox (kind, payload, idempotency_key, status, attempts, claims, event_id, order_id, trace_context,
                    created_at, available_at, last_error)
SELECT k.kind, jsonb_build_object('v', 1, 'order_id', o, 'event_id', 'evt_o' || o), k.prefix || '-' || o,
       'pending', a, a, 'evt_o' || o, o, '{TRACEPARENT}', t,
       CASE WHEN a = 0 THEN t ELSE t + (now() - t) * random() END,
       CASE WHEN a = 0 THEN NULL WHEN a % 2 = 0 THEN 'HTTP 503: upstream unavailable'
            ELSE replace('{REFUSED}', '/shipments', k.path) END
FROM generate_series(1, {orders}) n,
     LATERAL (SELECT {OUTAGE_ORDER0} + n AS o,
                     now() - interval '1 hour' + (n - 1) * (interval '1 hour' / {orders}) AS t OFFSET 0) x,
     -- the relay's backoff doubles from 1 s: about log2(age in s) attempts by now
     LATERAL (SELECT CASE WHEN n % 10 = 0 THEN 0
                          ELSE least(12, 1 + floor(random() * log(2.0, 1 + extract(epoch FROM now() - t))))::int
                     END AS a OFFSET 0) y,
     (VALUES ('ship_order', 'ship', '/shipments'), ('send_confirmation', 'conf', '/emails')) AS k(kind, prefix, path)
"""


def make_outage(bench: Bench) -> dict:
    events, done, due = CFG["outage_history_events"], CFG["outage_done_rows"], CFG["outage_due_rows"]
    bench.db.sql(Product.DB, "TRUNCATE processed_events, outbox;", timeout=300)
    t = time.monotonic()
    gen_events = generate(bench, "processed_events", history_events_sql, 1, events, events)
    gen_done = generate(bench, "outbox", history_outbox_sql, 1, done // 2, done // 2)
    t_due = time.monotonic()
    bench.db.sql(Product.DB, due_rows_sql(due), timeout=900)
    gen_due = round(time.monotonic() - t_due, 1)
    bench.db.sql(Product.DB, "VACUUM ANALYZE outbox; VACUUM ANALYZE processed_events; CHECKPOINT;", timeout=900)
    shape = bench.db.sql(Product.DB, """
SELECT count(*), count(*) FILTER (WHERE attempts > 0), max(attempts), count(*) FILTER (WHERE available_at > now())
  FROM outbox WHERE status = 'pending';
SELECT pg_size_pretty(pg_total_relation_size('processed_events')) || ' / '
       || pg_size_pretty(pg_total_relation_size('outbox'));""")
    pending, tried, max_attempts, not_due = (int(x) for x in shape[0].split("|"))
    if pending != due or not_due:
        raise BenchError(f"the outage made {pending:,} pending rows ({not_due:,} not due), not {due:,}")
    out = {"history_events": events, "done_rows": done // 2 * 2, "due_rows": pending, "tried_rows": tried,
           "max_attempts": max_attempts, "sizes": shape[1], "generate_events_secs": gen_events,
           "generate_done_secs": gen_done, "insert_due_secs": gen_due,
           "secs": round(time.monotonic() - t, 1)}
    log(f"  outage: {pending:,} due rows ({tried:,} tried, up to {max_attempts} attempts) on {events:,} events "
        f"and {out['done_rows']:,} done rows over 6 days ({shape[1]}): made in {out['secs']}s "
        f"(the due rows {gen_due}s)")
    return out


def run(bench: Bench) -> None:
    for relay in bench.relays:  # a relay of another phase would drain the rows too
        if relay.p.poll() is None:
            relay.stop()
    made = make_outage(bench)
    drain = drain_backlog(bench, Product.DB, "outage", timeout=900)
    r = bench.report
    r["relay_outage_rows"] = drain["rows"]
    r["relay_outage_rows_per_s"] = drain["rows_per_s"]
    r["relay_drain_flatness_outage"] = drain["flatness"]
    bench.details["outage"] = {"made": made, "relay_drain": drain}
    if CFG["outage_peer"] and not bench.peer_error:
        peer = peer_drain(bench, "peer-outage", [], {}, jobs=made["due_rows"])
        bench.details["outage"]["peer"] = peer
        r["peer_outage_jobs_per_s"] = peer["jobs_per_s"]
        log(f"  peer over as many no-op jobs: {peer['jobs']:,} jobs queued in {peer['queue_seconds']}s, drained "
            f"in {peer['seconds']}s = {peer['jobs_per_s']:,} jobs/s")
