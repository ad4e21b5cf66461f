"""The `fresh` and `outage` phases (runner.PHASES; the method:
docs/BENCHMARK.md): new services over a standing state.

fresh: a new deployment's first seconds on a just-migrated database, against
the steady state. A service's connections prepare their statements on first
use, and after five executions may keep a generic plan made from what the
planner knew then: on a just-migrated database, empty tables no ANALYZE
described. The steady run is measured here, on the same database a minute
later, rather than taken from the ingest phase: this machine's speed drifts
by more than the margin, and the phase then also runs alone.

outage: the relay when a downstream outage ends and its commands are all
due at once, on top of the history the tables hold. Made with set-based SQL
on bench_product: six days of history (inside the 7-day retention, so the
relay's prune deletes none of it during the drain); the due rows as the
ingest writes them (payload {v, order_id, event_id}, key, trace context),
nine in ten tried before as the relay's backoff allows in their age; then
VACUUM ANALYZE and a CHECKPOINT (an hour of autovacuum would have seen to
the tables)."""

from __future__ import annotations

import threading
import time
from itertools import pairwise

from .common import ratio
from .config import CFG, OUTAGE_ORDER0, TRACEPARENT, BenchError, log
from .db import Product, Session, generate, history_events_sql, history_outbox_sql
from .relay import follow_drain
from .services import Bench, provider_run, summary_brief

# The relay's error for each kind's call while its API was down.
REFUSED = ("connection failed: error sending request for url (http://downstream.internal/shipments): client error "
           "(Connect): tcp connect error: Connection refused (os error 111)")


class FreshDb(Product):
    """bench_fresh: made as bench_product is; the services reach it through
    their DATABASE_URL."""

    DB = "bench_fresh"


def c64_run(bench: Bench, tag: str) -> dict:
    """A new ingest on bench_fresh, 64 senders for `fresh_secs`, stopped after."""
    ingest = bench.start_ingest(tag, {"DATABASE_URL": bench.db.url(FreshDb.DB)})
    try:
        s = summary_brief(provider_run(ingest, tag, concurrency=64, secs=CFG["fresh_secs"]))
    finally:
        ingest.stop()
    log(f"  c64 {tag}: {s['requests_per_s']:,.0f} req/s, p99 {s['p99_ms']} ms {s.get('problems', '')}")
    return s


def crossing(curve: list, n: float) -> float:
    """When the effects reached `n` (interpolated between samples)."""
    for (t0, e0), (t1, e1) in pairwise(curve):
        if e1 >= n:
            return t1 if e1 == e0 else t0 + (t1 - t0) * (n - e0) / (e1 - e0)
    return curve[-1][0]


def drain_backlog(bench: Bench, database: str, tag: str, timeout: float) -> dict:
    """A new relay over the pending rows of `database`, all due: spawned in
    a thread so that sampling starts with it, the downstream's effects
    sampled every 20 ms until every row had one, then the database until
    none is pending (a sample takes 20 to 150 ms, the simulator's /stats
    included; the curve is interpolated between them). Rows per second over
    each tenth of the rows; `flatness`, the slower of the first and the last
    tenth over the faster: a slow start (plans) and a slow end (dead index
    entries) both lower it."""
    bench.reset_downstream()
    session = Session(bench.db, database)
    started: list = []
    starter = threading.Thread(target=lambda: started.append(
        bench.start_relay(tag, {"DATABASE_URL": bench.db.url(database)})), daemon=True)
    # What autovacuum worked on, and when (seconds since the spawn): its
    # CPU and I/O come out of the same two cores.
    autovacuum: dict[str, list[float]] = {}
    next_check = [0.0]

    def tick(now: float) -> None:
        if not starter.is_alive() and not started:
            raise BenchError(f"{tag}: the relay did not start; see the logs")
        if now >= next_check[0]:  # once a second
            next_check[0] = now + 1.0
            for what in session.query("SELECT query FROM pg_stat_activity "
                                      "WHERE backend_type = 'autovacuum worker' AND datname = current_database();"):
                autovacuum.setdefault(what, [round(now, 1), 0.0])[1] = round(now, 1)
    try:
        if not (rows := session.pending()):
            raise BenchError(f"{tag}: no pending row to drain")
        t0 = time.monotonic()
        starter.start()
        curve = follow_drain(bench, session, rows, t0, t0 + timeout, tag, tick=tick)
        t_end = time.monotonic() - t0
        double_effects = bench.stats()["double_effects"]
    finally:
        session.close()
        if starter.ident:
            starter.join(timeout=70)  # start_relay waits 60 s at most
        for relay in started:
            relay.stop()
    # From the first sample that saw an effect: the relay's start-up (at
    # most that sample's time) is not in the rates.
    start, first = next(p for p in curve if p[1] > 0)
    if first >= rows / 10:
        raise BenchError(f"{tag}: the first sample already saw {first:,} of {rows:,} effects")
    marks = [(start, first)] + [(crossing(curve, rows * k / 10), rows * k / 10) for k in range(1, 11)]
    tenths = [round((e1 - e0) / max(t1 - t0, 1e-6), 1) for (t0, e0), (t1, e1) in pairwise(marks)]
    out = {"rows": rows, "first_effect_secs": round(start, 3), "seconds": round(t_end - start, 3),
           "rows_per_s": round((rows - first) / (t_end - start), 1), "tenths_rows_per_s": tenths,
           "flatness": round(min(tenths[0], tenths[-1]) / max(tenths[0], tenths[-1]), 3),
           "double_effects": double_effects, "autovacuum_seen": autovacuum}
    log(f"  drain {tag}: {rows:,} rows in {out['seconds']:.2f}s = {out['rows_per_s']:,.0f} rows/s (the first "
        f"seen {start:.2f}s after the spawn); per tenth of the rows: {', '.join(f'{x:,.0f}' for x in tenths)}; "
        f"flatness {out['flatness']}; autovacuum {autovacuum}")
    return out


def run(bench: Bench) -> None:
    fresh = FreshDb(bench.db)
    fresh.create()
    bench.db.sql(FreshDb.DB, "CHECKPOINT;")
    first = c64_run(bench, "fresh")
    drain = drain_backlog(bench, FreshDb.DB, "fresh", timeout=300)
    fresh.reset(CFG["product_history"])
    steady = c64_run(bench, "steady")
    r = bench.report
    r["ingest_fresh_rps"], r["ingest_p99_ms_fresh"] = first["requests_per_s"], first["p99_ms"]
    r["ingest_steady_rps"] = steady["requests_per_s"]
    r["ingest_fresh_vs_steady"] = ratio(first["requests_per_s"], steady["requests_per_s"])
    r["relay_fresh_rows"], r["relay_fresh_rows_per_s"] = drain["rows"], drain["rows_per_s"]
    r["relay_drain_flatness_fresh"] = drain["flatness"]
    bench.details["fresh"] = {"ingest_fresh": first, "ingest_steady": steady, "relay_drain": drain}


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


def run_outage(bench: Bench) -> None:
    bench.stop_relays()  # a relay of another phase would drain the rows too
    events, done, due = CFG["outage_history_events"], CFG["outage_done_rows"], CFG["outage_due_rows"]
    bench.db.sql(Product.DB, "TRUNCATE processed_events, outbox;", timeout=300)
    generate(bench.db, "processed_events", history_events_sql, 1, events, events)
    generate(bench.db, "outbox", history_outbox_sql, 1, done // 2, done // 2)
    bench.db.sql(Product.DB, due_rows_sql(due), timeout=900)
    bench.db.sql(Product.DB, "VACUUM ANALYZE outbox; VACUUM ANALYZE processed_events; CHECKPOINT;", timeout=900)
    pending, not_due = map(int, bench.db.sql(Product.DB, "SELECT count(*), count(*) FILTER (WHERE available_at > "
                                                         "now()) FROM outbox WHERE status = 'pending';")[0].split("|"))
    if pending != due or not_due:
        raise BenchError(f"the outage made {pending:,} pending rows ({not_due:,} not due), not {due:,}")
    drain = drain_backlog(bench, Product.DB, "outage", timeout=900)
    r = bench.report
    r["relay_outage_rows"], r["relay_outage_rows_per_s"] = drain["rows"], drain["rows_per_s"]
    r["relay_drain_flatness_outage"] = drain["flatness"]
    bench.details["outage"] = {"relay_drain": drain}
