"""The `prune` phase (runner.PHASES): retention under load. Old done outbox
rows and processed events, then the ingest at half of peak (open loop) for a
baseline window, then at the same rate while `outbox-relay prune` deletes
them (250 rows per statement); that window's load stops when the prune ends."""

from __future__ import annotations

import re
import time

from .common import clean_env, run_cmd
from .config import (BIN, CFG, DUPLICATE_RATE, LOGS, PRUNE_AGE_DAYS, PRUNE_ORDER0, RETENTION_DAYS, BenchError,
                     log)
from .db import Product, generate, history_events_sql, history_outbox_sql
from .services import Bench, Service, provider_run, summary_brief


def run(bench: Bench) -> None:
    peak = bench.peak_rps()
    rate = peak / 2 / (1 + DUPLICATE_RATE)
    outbox_rows, events = CFG["prune_outbox_rows"], CFG["prune_events"]
    bench.stop_relays()  # a relay prunes on its own too
    bench.product.reset(CFG["product_history"])
    # The rows to prune, as the growth phase makes its history (indexes
    # dropped and re-created), PRUNE_AGE_DAYS days older than the history.
    t = time.monotonic()
    old = {"order0": PRUNE_ORDER0, "days_ago": PRUNE_AGE_DAYS}
    generate(bench.db, "outbox", lambda *a: history_outbox_sql(*a, **old), 1, outbox_rows // 2, outbox_rows // 2)
    generate(bench.db, "processed_events", lambda *a: history_events_sql(*a, seed="old", **old), 1, events, events)
    bench.db.sql(Product.DB, "VACUUM ANALYZE outbox; VACUUM ANALYZE processed_events; CHECKPOINT;", timeout=900)
    if prunable(bench) != (outbox_rows, events):
        raise BenchError(f"expected {outbox_rows:,} outbox rows and {events:,} events past the retention, "
                         f"found {prunable(bench)}")
    log(f"  {outbox_rows + events:,} rows past the retention: made in {time.monotonic() - t:.1f}s")
    pruned: dict = {}

    def prune() -> None:
        time.sleep(0.5)  # the provider's connections up first, as in the baseline
        t0 = time.monotonic()
        _, out, err = run_cmd("outbox-relay prune", [BIN / "outbox-relay", "prune"],
                              timeout=CFG["prune_timeout_secs"],
                              env=clean_env({"DATABASE_URL": bench.db.url(Product.DB),
                                             "RETENTION_DAYS": str(RETENTION_DAYS)}))
        pruned["secs"] = round(time.monotonic() - t0, 2)
        (LOGS / "prune.log").write_text(out + err)
        m = re.search(r"pruned (\d+) outbox row\(s\) and (\d+) processed event\(s\)", out)
        if not m:
            raise BenchError(f"outbox-relay prune: unexpected output {(out + err).strip()[-300:]!r}")
        pruned["outbox_rows"], pruned["processed_events"] = int(m.group(1)), int(m.group(2))

    ingest = bench.start_ingest("prune")
    try:
        # A new ingest's first seconds (connections, plans) are not what is measured.
        provider_run(ingest, "prune-warmup", rate=rate, secs=2.0)
        bench.product.undo_run()
        base = prune_window(bench, ingest, "prune-baseline", rate, CFG["half_secs"])
        bench.product.undo_run()
        during = prune_window(bench, ingest, "prune-during", rate, CFG["prune_timeout_secs"] + 30, prune)
    finally:
        ingest.stop()
    rows, left = pruned["outbox_rows"] + pruned["processed_events"], sum(prunable(bench))
    for tag, w in (("baseline", base), ("during the prune", during)):
        log(f"  {tag} {w['requests_per_s']:,.0f} req/s (target {peak / 2:,.0f}): p50 {w['p50_ms']} "
            f"p99 {w['p99_ms']} p99.9 {w['p999_ms']} max {w['max_ms']} ms; WAL {w['wal_mb']} MB")
    log(f"  prune deleted {rows:,} rows in {pruned['secs']}s ({left:,} past the retention left)")
    if (pruned["outbox_rows"], pruned["processed_events"]) != (outbox_rows, events) or left:
        bench.errors["prune_rows"] = f"prune deleted {pruned}, of {outbox_rows:,} and {events:,}; {left:,} left"
    bench.details["prune"] = {"prune": pruned, "baseline": base, "during": during}
    r = bench.report
    r["ingest_p99_ms_baseline_prune"], r["ingest_p99_ms_during_prune"] = base["p99_ms"], during["p99_ms"]
    r["ingest_p50_ms_baseline_prune"], r["ingest_p50_ms_during_prune"] = base["p50_ms"], during["p50_ms"]
    r["prune_load_rps"], r["prune_rows"], r["prune_secs"] = during["requests_per_s"], rows, pruned["secs"]
    r["prune_rows_per_s"] = round(rows / pruned["secs"]) if pruned["secs"] else None
    r["prune_note"] = (f"{CFG['mode']} mode: the prune deleted {outbox_rows:,} done outbox rows and "
                       f"{events:,} processed events, {PRUNE_AGE_DAYS} days old (RETENTION_DAYS="
                       f"{RETENTION_DAYS}), beside {CFG['product_history']:,} recent ones")


def prunable(bench: Bench) -> tuple[int, int]:
    """Outbox rows and processed events past the retention (what prune deletes)."""
    old = f"< now() - interval '{RETENTION_DAYS} days'"
    return tuple(int(x) for x in bench.db.sql(Product.DB, f"""
SELECT count(*) FROM outbox WHERE status IN ('done', 'cancelled') AND finished_at {old};
SELECT count(*) FROM processed_events WHERE processed_at {old};""", timeout=300))


def prune_window(bench: Bench, ingest: Service, tag: str, rate: float, secs: float, during=None) -> dict:
    """One open-loop provider run at `rate` events/s, for `secs` or until
    `during` returns; with the WAL written meanwhile (the prune's deletes
    write a full-page image per heap page after a checkpoint)."""
    wal = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
    wal0 = int(bench.db.sql(Product.DB, wal)[0])
    s = summary_brief(provider_run(ingest, tag, during=during, rate=rate, secs=secs))
    s["wal_mb"] = round((int(bench.db.sql(Product.DB, wal)[0]) - wal0) / 1e6, 1)
    return s
