"""The `prune` phase (runner.PHASES): retention under load."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import TYPE_CHECKING

from .common import clean_env, run_cmd
from .config import BIN, CFG, DUPLICATE_RATE, LOGS, PRUNE_AGE_DAYS, PRUNE_ORDER0, RETENTION_DAYS, BenchError, log
from .db import Db, Product, Session
from .history import generate, history_events_sql, history_outbox_sql
from .load import provider_run, summary_brief
from .services import Service

if TYPE_CHECKING:
    from .runner import Bench


class WaitSampler:
    """Samples pg_stat_activity every `interval` s from one session in a thread:
    per application (the ingest, the prune, autovacuum), how often a backend was
    active and on what it waited ("CPU" when on nothing)."""

    SQL = ("SELECT CASE WHEN backend_type = 'autovacuum worker' THEN 'autovacuum' ELSE application_name END, "
           "coalesce(wait_event_type || ':' || wait_event, 'CPU'), count(*) FROM pg_stat_activity "
           "WHERE datname = current_database() AND pid <> pg_backend_pid() AND (backend_type = 'autovacuum worker' "
           "OR (state = 'active' AND application_name IN ('webhook-ingest', 'outbox-relay-prune'))) "
           "GROUP BY 1, 2;")

    def __init__(self, db: Db, name: str, interval: float = 0.2) -> None:
        self.session = Session(db, name)
        self.interval = interval
        self.samples = 0
        self.counts: dict[str, dict[str, int]] = {}
        self.error: str | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        try:
            while not self.done.is_set():
                for row in self.session.query(self.SQL, timeout=30):
                    app, wait, n = row.split("|")
                    waits = self.counts.setdefault(app, {})
                    waits[wait] = waits.get(wait, 0) + int(n)
                self.samples += 1
                self.done.wait(self.interval)
        except BenchError as e:
            self.error = str(e)

    def stop(self) -> dict:
        """Per application: active backends on average, and the top waits as
        shares of the active samples."""
        self.done.set()
        self.thread.join(timeout=35)
        self.session.close()
        out: dict = {"samples": self.samples}
        for app, waits in sorted(self.counts.items()):
            total = sum(waits.values())
            top = sorted(waits.items(), key=lambda kv: -kv[1])[:6]
            out[app] = {"active_avg": round(total / max(self.samples, 1), 2),
                        "waits_pct": {w: round(100 * n / total, 1) for w, n in top}}
        if self.error:
            out["error"] = self.error
        return out


def run(bench: Bench) -> None:
    """Retention under load: old done outbox rows and processed events, then
    the ingest at half of peak (open loop) for a baseline window, then at the
    same rate while `outbox-relay prune` deletes them (250 rows per
    statement); that window's load stops when the prune ends."""
    peak = bench.peak_rps()
    rate = peak / 2 / (1 + DUPLICATE_RATE)
    outbox_rows, events = CFG["prune_outbox_rows"], CFG["prune_events"]
    for relay in bench.relays:
        if relay.p.poll() is None:
            relay.stop()  # a relay prunes on its own too
    bench.product.reset(CFG["product_history"])
    # The rows to prune, as the growth phase makes its history (indexes
    # dropped and re-created), PRUNE_AGE_DAYS days older than the history.
    gen_outbox = generate(bench, 
        "outbox", lambda a, b, total: history_outbox_sql(a, b, total, order0=PRUNE_ORDER0,
                                                         days_ago=PRUNE_AGE_DAYS),
        1, outbox_rows // 2, outbox_rows // 2)
    gen_events = generate(bench, 
        "processed_events", lambda a, b, total: history_events_sql(a, b, total, seed="old", order0=PRUNE_ORDER0,
                                                                   days_ago=PRUNE_AGE_DAYS),
        1, events, events)
    t_vac = time.monotonic()
    bench.db.sql(Product.DB, "VACUUM ANALYZE outbox; VACUUM ANALYZE processed_events; CHECKPOINT;", timeout=900)
    vac = round(time.monotonic() - t_vac, 1)
    old = prunable(bench)
    if old != (outbox_rows, events):
        raise BenchError(f"expected {outbox_rows:,} outbox rows and {events:,} events past the retention, "
                         f"found {old[0]:,} and {old[1]:,}")
    size = bench.db.one(Product.DB, "SELECT pg_size_pretty(pg_total_relation_size('processed_events')) "
                                   "|| ' / ' || pg_size_pretty(pg_total_relation_size('outbox'))")
    log(f"  {outbox_rows:,} done outbox rows and {events:,} processed events {PRUNE_AGE_DAYS} days old "
        f"beside {CFG['product_history']:,} recent ones ({size}): generated in {gen_outbox}s + {gen_events}s, "
        f"vacuum and checkpoint {vac}s")
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

    ingest = bench.services.start_ingest("prune")
    try:
        # A new ingest's first seconds (connections, plans) are not what is measured.
        provider_run(ingest.url, "prune-warmup", ingest, rate=rate, secs=2.0)
        undo_run(bench)
        base = prune_window(bench, ingest, "prune-baseline", rate, CFG["half_secs"])
        log(f"  baseline {base['requests_per_s']:,.0f} req/s (target {peak / 2:,.0f}): p50 {base['p50_ms']} "
            f"p99 {base['p99_ms']} p99.9 {base['p999_ms']} max {base['max_ms']} ms")
        undo_run(bench)
        during = prune_window(bench, ingest, "prune-during", rate, CFG["prune_timeout_secs"] + 30, prune)
    finally:
        ingest.stop()
    rows = pruned["outbox_rows"] + pruned["processed_events"]
    left = prunable(bench)
    rows_per_s = round(rows / pruned["secs"]) if pruned["secs"] else None
    log(f"  during the prune {during['requests_per_s']:,.0f} req/s: p50 {during['p50_ms']} p99 {during['p99_ms']} "
        f"p99.9 {during['p999_ms']} max {during['max_ms']} ms; prune deleted {pruned['outbox_rows']:,} outbox "
        f"rows and {pruned['processed_events']:,} events in {pruned['secs']}s = {rows_per_s:,} rows/s "
        f"({left[0] + left[1]:,} past the retention left)")
    for tag, w in (("baseline", base), ("during", during)):
        d = w["database"]
        log(f"    {tag}: WAL {d['wal_mb']} MB, {d['checkpoints']} checkpoint(s), {d['buffers_backend']} buffers "
            f"written by backends, outbox/events autovacuum {d['autovacuums']}, ingest waits "
            f"{w['waits'].get('webhook-ingest', {}).get('waits_pct')}")
    if (pruned["outbox_rows"], pruned["processed_events"]) != (outbox_rows, events) or left != (0, 0):
        bench.errors["prune_rows"] = (f"prune deleted {pruned['outbox_rows']:,} outbox rows and "
                                     f"{pruned['processed_events']:,} events of {outbox_rows:,} and {events:,}; "
                                     f"{left[0] + left[1]:,} left past the retention")
    bench.details["prune"] = {"old_outbox_rows": outbox_rows, "old_events": events,
                             "recent_history": CFG["product_history"], "generate_outbox_secs": gen_outbox,
                             "generate_events_secs": gen_events, "vacuum_secs": vac, "sizes_before": size,
                             "prune": pruned, "baseline": base, "during": during}
    r = bench.report
    r["ingest_p99_ms_baseline_prune"] = base["p99_ms"]
    r["ingest_p99_ms_during_prune"] = during["p99_ms"]
    r["ingest_p50_ms_baseline_prune"] = base["p50_ms"]
    r["ingest_p50_ms_during_prune"] = during["p50_ms"]
    r["prune_load_rps"] = during["requests_per_s"]
    r["prune_rows"] = rows
    r["prune_secs"] = pruned["secs"]
    r["prune_rows_per_s"] = rows_per_s
    r["prune_note"] = (f"{CFG['mode']} mode: the prune deleted {outbox_rows:,} done outbox rows and "
                       f"{events:,} processed events, {PRUNE_AGE_DAYS} days old (RETENTION_DAYS="
                       f"{RETENTION_DAYS}), beside {CFG['product_history']:,} recent ones")


def undo_run(bench: Bench, timeout: float = 600) -> None:
    """Every order pending again (a provider run pays orders 1, 2, ..: the
    next would find them paid) and no pending outbox row; the run's
    processed events stay (recent, new ids). Vacuumed, checkpointed."""
    bench.db.sql(Product.DB, """
DELETE FROM outbox WHERE status = 'pending';
UPDATE orders SET status = 'pending', updated_at = now() WHERE status <> 'pending';
VACUUM ANALYZE orders; VACUUM ANALYZE outbox; VACUUM ANALYZE processed_events; CHECKPOINT;""", timeout=timeout)


def prunable(bench: Bench) -> tuple[int, int]:
    """Outbox rows and processed events past the retention (what prune deletes)."""
    row = bench.db.one(Product.DB, f"""
SELECT (SELECT count(*) FROM outbox WHERE status IN ('done', 'cancelled')
       AND finished_at < now() - interval '{RETENTION_DAYS} days')
   || '|' || (SELECT count(*) FROM processed_events WHERE processed_at < now() - interval '{RETENTION_DAYS} days')
""", timeout=300)
    a, b = row.split("|")
    return int(a), int(b)


def db_counters(bench: Bench) -> dict:
    """WAL position, checkpoints and backends' own buffer writes (pg_stat_bgwriter
    before PostgreSQL 17; None where a column moved), outbox and events autovacuums."""
    row = bench.db.one(Product.DB, """
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint || '|' || (SELECT to_jsonb(b) FROM pg_stat_bgwriter b)
   || '|' || (SELECT sum(autovacuum_count) FROM pg_stat_user_tables
               WHERE relname IN ('outbox', 'processed_events'))""")
    wal, bgw, av = row.split("|")
    b = json.loads(bgw)
    ckpt = (b["checkpoints_timed"] + b["checkpoints_req"]) if "checkpoints_req" in b else None
    return {"wal": int(wal), "checkpoints": ckpt, "buffers_backend": b.get("buffers_backend"),
            "autovacuums": int(av)}


def prune_window(bench: Bench, ingest: Service, tag: str, rate: float, secs: float, during=None) -> dict:
    """One open-loop provider run at `rate` events/s, for `secs` or until
    `during` returns; with what the database did meanwhile."""
    c0 = db_counters(bench)
    sampler = WaitSampler(bench.db, Product.DB)
    try:
        s = summary_brief(provider_run(ingest.url, tag, ingest, during=during, rate=rate, secs=secs))
    finally:
        waits = sampler.stop()
    c1 = db_counters(bench)

    def diff(k: str):
        return None if c0[k] is None or c1[k] is None else c1[k] - c0[k]

    s["events_rate"] = round(rate, 1)
    s["database"] = {"wal_mb": round(diff("wal") / 1e6, 1), "checkpoints": diff("checkpoints"),
                     "buffers_backend": diff("buffers_backend"), "autovacuums": diff("autovacuums")}
    s["waits"] = waits
    return s
