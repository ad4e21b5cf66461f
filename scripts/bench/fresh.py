"""The `fresh` and `outage` phases (docs/BENCHMARK.md): new services over a standing state.
The steady state is measured on the fresh database a minute later, not taken from the ingest
phase: this machine's speed drifts by more than the margin."""

from __future__ import annotations

import threading
import time
from itertools import pairwise

from .common import CFG, OUTAGE_ORDER0, TRACEPARENT, BenchError, log, ratio
from .db import FRESH, PRODUCT, VACUUM, Session, generate, history_events_sql, history_outbox_sql
from .relay import follow_drain
from .services import Bench

# The relay's error for each kind's call while its API was down.
REFUSED = ("connection failed: error sending request for url (http://downstream.internal/"
           "shipments): client error (Connect): tcp connect error: Connection refused (os error "
           "111)")


def crossing(curve: list, n: float) -> float:
    """When the effects reached `n` (interpolated between samples)."""
    for (t0, e0), (t1, e1) in pairwise(curve):
        if e1 >= n:
            return t1 if e1 == e0 else t0 + (t1 - t0) * (n - e0) / (e1 - e0)
    return curve[-1][0]


def drain_backlog(bench: Bench, database: str, tag: str, timeout: float) -> dict:
    """A new relay over the pending rows of `database`, spawned in a thread so that sampling
    starts with it: rows/s over each tenth of the rows; `flatness`, the first and the last
    tenth's, the slower over the faster."""
    bench.reset_downstream()
    session = Session(bench.db, database)
    started: list = []
    env = {"DATABASE_URL": bench.db.url(database)}
    starter = threading.Thread(target=lambda: started.append(bench.start_relay(tag, env)),
                               daemon=True)
    # What autovacuum worked on, and when (seconds since the spawn): it shares the cores.
    autovacuum: dict[str, list[float]] = {}
    next_check = [0.0]

    def tick(now: float) -> None:
        if not starter.is_alive() and not started:
            raise BenchError(f"{tag}: the relay did not start; see the logs")
        if now >= next_check[0]:  # once a second
            next_check[0] = now + 1.0
            for what in session.query("SELECT query FROM pg_stat_activity WHERE backend_type "
                                      "= 'autovacuum worker' AND datname = current_database();"):
                autovacuum.setdefault(what, [round(now, 1), 0.0])[1] = round(now, 1)

    try:
        if not (rows := session.pending()):
            raise BenchError(f"{tag}: no pending row to drain")
        t0 = time.monotonic()
        starter.start()
        curve = follow_drain(bench, session, rows, t0, t0 + timeout, tag, tick=tick)
        t_end = time.monotonic() - t0
    finally:
        session.close()
        if starter.ident:
            starter.join(timeout=70)  # start_relay waits 60 s at most
        for relay in started:
            relay.stop()
    # From the first sample that saw an effect: the relay's start-up is not in the rates.
    start, first = next(p for p in curve if p[1] > 0)
    if first >= rows / 10:
        raise BenchError(f"{tag}: the first sample already saw {first:,} of {rows:,} effects")
    marks = [(start, first)] + [(crossing(curve, rows * k / 10), rows * k / 10)
                                for k in range(1, 11)]
    tenths = [round((e1 - e0) / max(t1 - t0, 1e-6), 1) for (t0, e0), (t1, e1) in pairwise(marks)]
    out = {"rows": rows, "first_effect_secs": round(start, 3), "seconds": round(t_end - start, 3),
           "rows_per_s": round((rows - first) / (t_end - start), 1), "tenths_rows_per_s": tenths,
           "flatness": round(min(tenths[0], tenths[-1]) / max(tenths[0], tenths[-1]), 3),
           "autovacuum_seen": autovacuum}
    log(f"  drain {tag}: {rows:,} rows, {out['rows_per_s']:,.0f} rows/s, tenths {tenths}")
    return out


def run(bench: Bench) -> None:
    bench.db.create_product(FRESH)
    bench.db.sql(FRESH, "CHECKPOINT;")
    first = bench.run_new_ingest("fresh", CFG["fresh_secs"], FRESH)
    drain = drain_backlog(bench, FRESH, "fresh", timeout=300)
    bench.db.reset_product(CFG["product_history"], FRESH)
    steady = bench.run_new_ingest("steady", CFG["fresh_secs"], FRESH)
    bench.report.update(
        ingest_fresh_rps=first["requests_per_s"], ingest_p99_ms_fresh=first["p99_ms"],
        ingest_steady_rps=steady["requests_per_s"],
        ingest_fresh_vs_steady=ratio(first["requests_per_s"], steady["requests_per_s"]),
        relay_fresh_rows=drain["rows"], relay_fresh_rows_per_s=drain["rows_per_s"],
        relay_drain_flatness_fresh=drain["flatness"])
    bench.details["fresh"] = {"ingest_fresh": first, "ingest_steady": steady, "relay_drain": drain}


def due_rows_sql(rows: int) -> str:
    """`rows` pending commands left by an hour-long outage, all due now, nine in ten tried
    before as the relay's backoff allows in their age."""
    orders = rows // 2
    return f"""
INSERT INTO outbox (kind, payload, idempotency_key, status, attempts, claims, event_id,
                    order_id, trace_context, created_at, available_at, last_error)
SELECT k.kind, jsonb_build_object('v', 1, 'order_id', o, 'event_id', 'evt_o' || o),
       k.prefix || '-' || o, 'pending', a, a, 'evt_o' || o, o, '{TRACEPARENT}', t,
       CASE WHEN a = 0 THEN t ELSE t + (now() - t) * random() END,
       CASE WHEN a = 0 THEN NULL WHEN a % 2 = 0 THEN 'HTTP 503: upstream unavailable'
            ELSE replace('{REFUSED}', '/shipments', k.path) END
FROM generate_series(1, {orders}) n,
     LATERAL (SELECT {OUTAGE_ORDER0} + n AS o,
                     now() - interval '1 hour' + (n - 1) * (interval '1 hour' / {orders}) AS t
              OFFSET 0) x,
     -- the relay's backoff doubles from 1 s: about log2(age in s) attempts by now
     LATERAL (SELECT CASE WHEN n % 10 = 0 THEN 0 ELSE least(12, 1 + floor(random()
                          * log(2.0, 1 + extract(epoch FROM now() - t))))::int END AS a
              OFFSET 0) y,
     (VALUES ('ship_order', 'ship', '/shipments'), ('send_confirmation', 'conf', '/emails'))
       AS k(kind, prefix, path)
"""


def run_outage(bench: Bench) -> None:
    bench.stop_relays()  # a relay of another phase would drain the rows too
    events, done = CFG["outage_history_events"], CFG["outage_done_rows"]
    due = CFG["outage_due_rows"]
    bench.db.sql(PRODUCT, "TRUNCATE processed_events, outbox;", timeout=300)
    generate(bench.db, "processed_events", history_events_sql, 1, events, events)
    generate(bench.db, "outbox", history_outbox_sql, 1, done // 2, done // 2)
    bench.db.sql(PRODUCT, due_rows_sql(due), timeout=900)
    bench.db.sql(PRODUCT, VACUUM, timeout=900)
    pending, not_due = map(int, bench.db.sql(PRODUCT, (
        "SELECT count(*), count(*) FILTER (WHERE available_at > now()) FROM outbox "
        "WHERE status = 'pending';"))[0].split("|"))
    if pending != due or not_due:
        raise BenchError(f"the outage made {pending:,} pending rows ({not_due:,} not due)")
    drain = drain_backlog(bench, PRODUCT, "outage", timeout=900)
    r = bench.report
    r.update(relay_outage_rows=drain["rows"], relay_outage_rows_per_s=drain["rows_per_s"],
             relay_drain_flatness_outage=drain["flatness"])
    bench.details["outage"] = {"relay_drain": drain}
