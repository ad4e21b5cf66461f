"""The `fresh` phase (runner.PHASES; the method: docs/BENCHMARK.md): a new
deployment's first seconds on a just-migrated database, against the steady
state. A service's connections prepare their statements on first use, and
after five executions may keep a generic plan made from what the planner
knew then: on a just-migrated database, empty tables no ANALYZE described.
The steady run is measured here, on the same database a minute later,
rather than taken from the ingest phase: this machine's speed drifts by
more than the margin, and the phase then also runs alone. Each window
records the tables' scans and autovacuum/autoanalyze runs and the CPU per
request by process: a generic plan gone bad shows as sequential scans and
Postgres CPU."""

from __future__ import annotations

import threading
import time
from itertools import pairwise
from typing import TYPE_CHECKING

from .common import ratio
from .config import CFG, BenchError, log
from .cpu_split import Split, brief, per_unit
from .db import Product, Session
from .load import provider_run, summary_brief
from .prune import db_counters
from .relay import follow_drain

if TYPE_CHECKING:
    from .runner import Bench


class FreshDb(Product):
    """bench_fresh: made as bench_product is; the services reach it through
    their DATABASE_URL."""

    DB = "bench_fresh"


TABLES = ("processed_events", "outbox", "orders")
COUNTERS = ("seq_scan", "seq_tup_read", "idx_scan", "autovacuums", "autoanalyzes")


def table_stats(bench: Bench, database: str) -> dict:
    """Per table: the counters of pg_stat_user_tables a bad plan or a
    maintenance run moves, the rows, and when autovacuum last vacuumed and
    analyzed it (Unix seconds, 0 never)."""
    rows = bench.db.sql(database, "SELECT relname, seq_scan, seq_tup_read, coalesce(idx_scan, 0), autovacuum_count, "
                                  "autoanalyze_count, n_live_tup, "
                                  "coalesce(extract(epoch FROM last_autovacuum), 0), "
                                  "coalesce(extract(epoch FROM last_autoanalyze), 0) FROM pg_stat_user_tables "
                                  f"WHERE relname IN ({', '.join(repr(t) for t in TABLES)});")
    keys = (*COUNTERS, "n_live_tup", "last_autovacuum", "last_autoanalyze")
    return {name: dict(zip(keys, map(float, rest))) for name, *rest in (r.split("|") for r in rows)}


def stats_delta(before: dict, after: dict, t0: float) -> dict:
    """The counters' change, the rows after, and the seconds from `t0` (Unix)
    to the end of an autovacuum or autoanalyze made since."""
    out = {}
    for t, a in after.items():
        out[t] = {k: int(a[k] - before.get(t, {}).get(k, 0)) for k in COUNTERS}
        out[t]["n_live_tup"] = int(a["n_live_tup"])
        for run in ("autovacuum", "autoanalyze"):
            if a[f"last_{run}"] > t0:
                out[t][f"{run}_ended_after_secs"] = round(a[f"last_{run}"] - t0, 1)
    return out


def c64_run(bench: Bench, tag: str) -> dict:
    """A new ingest on bench_fresh, 64 senders for `fresh_secs`, stopped after."""
    ingest = bench.services.start_ingest(tag, {"DATABASE_URL": bench.db.url(FreshDb.DB)})
    try:
        stats0, t0 = table_stats(bench, FreshDb.DB), time.time()
        split = Split(bench, FreshDb.DB, {"ingest": ingest.p.pid}, "load generator").start()
        s = summary_brief(provider_run(ingest.url, tag, ingest, concurrency=64, secs=CFG["fresh_secs"]))
        s["cpu_us_per_request"] = per_unit(split.stop(), s["deliveries"] or 0)
        s["tables"] = stats_delta(stats0, table_stats(bench, FreshDb.DB), t0)
    finally:
        ingest.stop()
    t = s["tables"]
    log(f"  c64 {tag}: {s['requests_per_s']:,.0f} req/s, p50 {s['p50_ms']} p99 {s['p99_ms']} ms; cpu us per "
        f"request: {brief(s['cpu_us_per_request'])}; seq scans events/outbox/orders "
        f"{t['processed_events']['seq_scan']}/{t['outbox']['seq_scan']}/{t['orders']['seq_scan']}, autoanalyze "
        f"{t['processed_events']['autoanalyzes']}/{t['outbox']['autoanalyzes']}/{t['orders']['autoanalyzes']}"
        + "".join(f" ({name} at {t[name]['autoanalyze_ended_after_secs']}s)" for name in TABLES
                  if "autoanalyze_ended_after_secs" in t[name])
        + (f"  PROBLEMS {s['problems']}" if s.get("problems") else ""))
    return s


def crossing(curve: list, n: float) -> float:
    """When the effects reached `n` (interpolated between samples)."""
    for (t0, e0), (t1, e1) in pairwise(curve):
        if e1 >= n:
            return t1 if e1 == e0 else t0 + (t1 - t0) * (n - e0) / (e1 - e0)
    return curve[-1][0]


def thinned(curve: list, every: float) -> list:
    """A sample every `every` seconds at most, the last one kept."""
    kept = curve[:1]
    for p in curve[1:]:
        if p[0] - kept[-1][0] >= every or p is curve[-1]:
            kept.append(p)
    return kept


def drain_backlog(bench: Bench, database: str, tag: str, timeout: float) -> dict:
    """A new relay over the pending rows of `database`, all due: spawned in
    a thread so that sampling starts with it, the downstream's effects
    sampled every 20 ms until every row had one, then the database until
    none is pending (a sample takes 20 to 150 ms, the simulator's /stats
    included; the curve is interpolated between them). Rows per second over
    each tenth of the rows; `flatness`, the slower of the first and the last
    tenth over the faster: a slow start (plans) and a slow end (dead index
    entries) both lower it."""
    bench.services.reset_downstream()
    session = Session(bench.db, database)
    started: list = []
    starter = None
    try:
        rows = int(session.query("SELECT count(*) FROM outbox WHERE status = 'pending';")[0])
        if not rows:
            raise BenchError(f"{tag}: no pending row to drain")
        stats0, wall0, db0 = table_stats(bench, database), time.time(), db_counters(bench)

        def start() -> None:
            try:
                started.append(bench.services.start_relay(tag, {"DATABASE_URL": bench.db.url(database)}))
            except (BenchError, OSError) as e:  # raised by the sampling loop
                started.append(e)

        starter = threading.Thread(target=start, daemon=True)
        t0 = time.monotonic()
        starter.start()
        # What autovacuum worked on, and when (seconds since the spawn): its
        # CPU and I/O come out of the same two cores.
        autovacuum: dict[str, list[float]] = {}
        next_check = [0.0]

        def tick(now: float) -> None:
            if started and isinstance(started[0], Exception):
                raise started[0]
            if now >= next_check[0]:  # once a second
                next_check[0] = now + 1.0
                for what in session.query("SELECT query FROM pg_stat_activity "
                                          "WHERE backend_type = 'autovacuum worker' AND datname = current_database();"):
                    autovacuum.setdefault(what, [round(now, 1), 0.0])[1] = round(now, 1)

        curve, _, effects, pending = follow_drain(bench, session, rows, t0, t0 + timeout, tick=tick)
        t_end = time.monotonic() - t0
        if pending:
            raise BenchError(f"{tag}: {effects:,} of {rows:,} effects, and rows still pending, after {timeout:.0f}s")
        st = bench.services.stats()
        db1 = db_counters(bench)
    finally:
        session.close()
        if starter:
            starter.join(timeout=70)  # start_relay waits 60 s at most
        for relay in started:
            if not isinstance(relay, Exception):
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
           "first_tenth_rows_per_s": tenths[0], "last_tenth_rows_per_s": tenths[-1],
           "flatness": round(min(tenths[0], tenths[-1]) / max(tenths[0], tenths[-1]), 3),
           "downstream_requests": st["requests"], "double_effects": st["double_effects"],
           # cluster-wide
           "wal_mb": round((db1["wal"] - db0["wal"]) / 1e6, 1),
           "checkpoints": None if db0["checkpoints"] is None else db1["checkpoints"] - db0["checkpoints"],
           "autovacuum_seen": autovacuum, "tables_before": stats0,
           "tables": stats_delta(stats0, table_stats(bench, database), wall0),
           # [seconds since the relay was spawned, effects], a sample every 0.1 s
           "effects_curve": thinned(curve, 0.1)}
    ob = out["tables"]["outbox"]
    log(f"  drain {tag}: {rows:,} rows in {out['seconds']:.2f}s = {out['rows_per_s']:,.0f} rows/s (the first "
        f"seen {start:.2f}s after the spawn); per tenth of the rows: {', '.join(f'{x:,.0f}' for x in tenths)}; "
        f"flatness {out['flatness']}; outbox autovacuum {ob['autovacuums']} autoanalyze {ob['autoanalyzes']}"
        + "".join(f"; {what.removeprefix('autovacuum: ')} from {t1:.0f} to {t2:.0f}s"
                  for what, (t1, t2) in autovacuum.items())
        + f"; WAL {out['wal_mb']:,.0f} MB, {out['checkpoints']} checkpoint(s); {st['double_effects']} double effects")
    return out


def run(bench: Bench) -> None:
    fresh = FreshDb(bench.db)
    t = time.monotonic()
    fresh.create()
    bench.db.sql(FreshDb.DB, "CHECKPOINT;")
    log(f"  bench_fresh migrated, {time.monotonic() - t:.1f}s")
    first = c64_run(bench, "fresh")
    drain = drain_backlog(bench, FreshDb.DB, "fresh", timeout=300)
    fresh.reset(CFG["product_history"])
    steady = c64_run(bench, "steady")
    r = bench.report
    r["ingest_fresh_rps"] = first["requests_per_s"]
    r["ingest_p99_ms_fresh"] = first["p99_ms"]
    r["ingest_steady_rps"] = steady["requests_per_s"]
    r["ingest_fresh_vs_steady"] = ratio(first["requests_per_s"], steady["requests_per_s"])
    r["relay_fresh_rows"] = drain["rows"]
    r["relay_fresh_rows_per_s"] = drain["rows_per_s"]
    r["relay_drain_flatness_fresh"] = drain["flatness"]
    bench.details["fresh"] = {"ingest_fresh": first, "ingest_steady": steady, "relay_drain": drain}
    log(f"  fresh/steady {r['ingest_fresh_vs_steady']}; relay drain flatness {drain['flatness']}")
