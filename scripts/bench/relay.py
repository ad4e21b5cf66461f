"""The `relay` phase (runner.PHASES): drains of rows inserted at once, then
the end-to-end peak of the ingest with a relay draining."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from .common import CpuMeter
from .cpu_split import Split, per_unit
from .config import CFG, DRAIN_ORDER0, TRACEPARENT, BenchError, log
from .db import Product, Session
from .load import provider_run, summary_brief
from .services import Service

if TYPE_CHECKING:
    from .runner import Bench


def drain_rows_sql(first_order: int, rows: int) -> str:
    """`rows` pending commands (half shipments, half confirmations), due now."""
    last = first_order + rows // 2 - 1
    return f"""
INSERT INTO outbox (kind, payload, idempotency_key, event_id, order_id, trace_context)
SELECT k.kind, jsonb_build_object('v', 1, 'order_id', o, 'event_id', 'evt_' || o), k.prefix || '-' || o,
       'evt_' || o, o, '{TRACEPARENT}'
FROM generate_series({first_order}, {last}) o,
     (VALUES ('ship_order', 'ship'), ('send_confirmation', 'conf')) AS k(kind, prefix)
"""


def drain(bench: Bench, session: Session, relays: list[Service], n: int, tag: str, rows: int | None = None) -> dict:
    rows = rows or CFG["relay_rows"]
    first = DRAIN_ORDER0 + n * 1_000_000
    bench.services.reset_downstream()
    maint0 = outbox_maintenance(session)
    own_backend = int(session.query("SELECT pg_backend_pid();")[0])
    session.query("BEGIN;\n" + drain_rows_sql(first, rows) + ";\nNOTIFY outbox_pending;", timeout=120)
    pids = {f"relay {r.tag}": r.p.pid for r in relays}
    if bench.services.downstream:
        pids["downstream"] = bench.services.downstream.pid
    split = Split(bench, Product.DB, pids, exclude={own_backend}).start()
    marker = session.send("COMMIT;")
    t0 = time.monotonic()  # the rows become visible with this commit
    session.wait(marker, timeout=60)
    # The effects over time, for the report's plot of the drains: a sample
    # every 50 ms at most.
    curve, t_effects, effects, pending = follow_drain(bench, session, rows, t0, t0 + 300, every=0.05)
    secs = time.monotonic() - t0
    cpu = split.stop()
    if pending != 0:
        raise BenchError(f"drain {tag}: {pending} rows still pending after {secs:.0f}s "
                         f"({effects} effects downstream)")
    st = bench.services.stats()
    relay_cpu = sum(v for k, v in cpu["cpu_secs"].items() if k.startswith("relay "))
    maint1 = outbox_maintenance(session)
    out = {"rows": rows, "relays": len(relays), "seconds": round(secs, 3),
           "rows_per_s": round(rows / secs, 1), "seconds_to_last_effect": round(t_effects, 3),
           "downstream_requests": st["requests"], "downstream_effects": st["effects"],
           "double_effects": st["double_effects"], "relay_cpu_secs": round(relay_cpu, 2),
           "machine_cores_busy": cpu["machine_cores_busy"], "cpu_us_per_row": per_unit(cpu, rows),
           # Autovacuum and autoanalyze of the outbox during the drain: a
           # new ANALYZE re-plans the relay's prepared statements.
           "outbox_autovacuums": maint1["autovacuum_count"] - maint0["autovacuum_count"],
           "outbox_autoanalyzes": maint1["autoanalyze_count"] - maint0["autoanalyze_count"],
           "outbox_dead_tuples_after": maint1["n_dead_tup"],
           # [seconds since the COMMIT, effects at the downstream]
           "effects_curve": curve}
    log(f"  drain {tag}: {rows:,} rows in {secs:.2f}s = {out['rows_per_s']:,.0f} rows/s "
        f"({len(relays)} relay{'s' if len(relays) > 1 else ''}, relay cpu {relay_cpu:.1f}s, "
        f"{st['requests']:,} requests, {st['double_effects']} double effects, outbox autovacuum "
        f"{out['outbox_autovacuums']} autoanalyze {out['outbox_autoanalyzes']})")
    return out


def follow_drain(bench: Bench, session: Session, rows: int, t0: float, deadline: float, every: float = 0.0,
                 tick=None) -> tuple[list, float, int, int]:
    """Follows a drain of `rows` that started at `t0` (monotonic) until
    `deadline`: cheap polling of the simulator's counters (no database load)
    until every row had its effect, `tick(seconds since t0)` called between
    samples, then the database until no row is pending. Returns the effects
    over time ([seconds since t0, effects], a sample every `every` seconds
    at most), the seconds to the last effect, the effects seen, and the rows
    still pending (0: drained; -1: the deadline came first)."""
    curve = [[0.0, 0]]
    effects = 0
    while time.monotonic() < deadline:
        effects = bench.services.stats()["effects"]
        now = time.monotonic() - t0
        if now - curve[-1][0] >= every or effects >= rows:
            curve.append([round(now, 3), effects])
        if effects >= rows:
            break
        if tick:
            tick(now)
        time.sleep(0.02)
    t_effects = time.monotonic() - t0
    pending = -1
    while time.monotonic() < deadline:
        pending = int(session.query("SELECT count(*) FROM outbox WHERE status = 'pending';")[0])
        if pending == 0:
            break
        time.sleep(0.005)
    return curve, t_effects, effects, pending


def outbox_maintenance(session: Session) -> dict:
    row = session.query("SELECT autovacuum_count, autoanalyze_count, n_dead_tup FROM pg_stat_user_tables "
                        "WHERE relname = 'outbox';")[0].split("|")
    return {"autovacuum_count": int(row[0]), "autoanalyze_count": int(row[1]), "n_dead_tup": int(row[2])}


def run(bench: Bench) -> None:
    # Outbox with its done history only; vacuumed once, before the first drain.
    bench.product.reset(CFG["product_history"])
    relay = bench.services.start_relay("a")
    bench.relays.append(relay)
    session = Session(bench.db, Product.DB)
    try:
        drains = []
        for i in range(3):
            drains.append(drain(bench, session, [relay], i, f"{i + 1}/3 (one relay)"))
        # Two relays start from the state the first drain did (vacuumed).
        session.query("VACUUM ANALYZE outbox; CHECKPOINT;", timeout=300)
        relay_b = bench.services.start_relay("b")
        bench.relays.append(relay_b)
        two = drain(bench, session, [relay, relay_b], 3, "two relays")
        bench.rss["relay_b"] = relay_b.rss()
        relay_b.stop()
    finally:
        session.close()
    with_relay = None
    if bench.ingest:
        with_relay = end_to_end_peak(bench)
    rates = [d["rows_per_s"] for d in drains]
    bench.details["relay"] = {"drains_one_relay": drains, "two_relays": two, "ingest_c64_with_relay": with_relay,
                             "note": "three back-to-back drains, no VACUUM between them; "
                                     "then VACUUM, then the two-relay drain"}
    r = bench.report
    r["relay_rows_per_s_1"] = rates[0]
    r["relay_rows_per_s_2"] = two["rows_per_s"]
    r["relay_drain_rows_per_s"] = rates
    r["relay_decay_ratio"] = round(min(rates) / max(rates), 3)


def end_to_end_peak(bench: Bench) -> dict:
    """The ingest at 64 senders again, now with a relay delivering what it
    enqueues (as deployed), then until the relay has delivered everything:
    the deployed shape's peak. The ingest outruns the relay for the run (its
    64 senders win the cores), so the rate answered is not sustainable; what
    the machine sustains is the webhooks answered and delivered per second
    of all its cores, from the first request until nothing is pending
    (`e2e_peak_rps`). The mixed-load figures (e2e.py) run at half of it."""
    bench.product.reset(CFG["product_history"])
    bench.services.reset_downstream()
    meter = CpuMeter()
    t0 = time.monotonic()
    out = summary_brief(provider_run(bench.ingest.url, "c64-with-relay", bench.ingest,
                                     concurrency=64, secs=CFG["trace_secs"]))
    out["outbox_pending_after"] = int(bench.db.one(
        Product.DB, "SELECT count(*) FROM outbox WHERE status = 'pending'"))
    session = Session(bench.db, Product.DB)
    try:
        pending = out["outbox_pending_after"]
        while pending and time.monotonic() < t0 + 300:
            time.sleep(0.01)
            pending = int(session.query("SELECT count(*) FROM outbox WHERE status = 'pending';")[0])
    finally:
        session.close()
    secs = time.monotonic() - t0
    busy = meter.cores_busy()
    if pending:
        raise BenchError(f"the relay left {pending} rows pending 300 s after the 64-sender run")
    cores = os.cpu_count() or 1
    out["downstream_effects"] = bench.services.stats()["effects"]
    out["seconds_to_delivered"] = round(secs, 3)
    out["machine_cores_busy_to_delivered"] = busy
    # Per second of all the cores: the drain after the load leaves some idle.
    out["e2e_peak_rps"] = round(out["deliveries"] / secs * cores / max(busy, 0.01), 1)
    r = bench.report
    r["ingest_rps_c64_with_relay"] = out["requests_per_s"]
    r["ingest_p99_ms_c64_with_relay"] = out["p99_ms"]
    r["e2e_peak_rps"] = out["e2e_peak_rps"]
    log(f"  c64 with a relay draining: {out['requests_per_s']:,.0f} req/s, p50 {out['p50_ms']} "
        f"p99 {out['p99_ms']} ms ({out['outbox_pending_after']:,} pending at the end); "
        f"{out['deliveries']:,} webhooks answered and delivered in {secs:.2f}s with {busy} of {cores} cores busy: "
        f"end-to-end peak {out['e2e_peak_rps']:,.0f} webhooks/s")
    return out
