"""The phases over a big history: `prune` (retention under load) and `growth`."""

from __future__ import annotations

import re
import statistics
import time

from .common import BIN, CFG, LOGS, PRUNE_AGE_DAYS, PRUNE_ORDER0, RETENTION_DAYS, ROOT
from .common import BenchError, clean_env, hlabel, log, run_cmd
from .db import PRODUCT, VACUUM, generate, history_events_sql, history_outbox_sql
from .services import Bench, Service, provider_run


def run_prune(bench: Bench) -> None:
    rps, r = bench.peak_rps() / 2, bench.report
    outbox_rows, events = CFG["prune_outbox_rows"], CFG["prune_events"]
    bench.stop_relays()  # a relay prunes on its own too
    bench.db.reset_product(CFG["product_history"])
    # The rows to prune, as the growth phase makes its history, PRUNE_AGE_DAYS days older.
    old = {"order0": PRUNE_ORDER0, "days_ago": PRUNE_AGE_DAYS}
    generate(bench.db, "outbox", lambda *a: history_outbox_sql(*a, **old),
             1, outbox_rows // 2, outbox_rows // 2)
    generate(bench.db, "processed_events", lambda *a: history_events_sql(*a, seed="old", **old),
             1, events, events)
    bench.db.sql(PRODUCT, VACUUM, timeout=900)
    if prunable(bench) != (outbox_rows, events):
        raise BenchError(f"expected {outbox_rows:,} outbox rows and {events:,} events past the "
                         f"retention, found {prunable(bench)}")
    pruned: dict = {}

    def prune() -> None:
        time.sleep(0.5)  # the provider's connections up first, as in the baseline
        t0 = time.monotonic()
        env = clean_env({"DATABASE_URL": bench.db.url(PRODUCT), "RETENTION_DAYS": RETENTION_DAYS})
        _, out, err = run_cmd("outbox-relay prune", [BIN / "outbox-relay", "prune"],
                              CFG["prune_timeout_secs"], env)
        pruned["secs"] = round(time.monotonic() - t0, 2)
        (LOGS / "prune.log").write_text(out + err)
        m = re.search(r"pruned (\d+) outbox row\(s\) and (\d+) processed event\(s\)", out)
        if not m:
            raise BenchError(f"outbox-relay prune: unexpected output {(out + err)[-300:]!r}")
        pruned["outbox_rows"], pruned["processed_events"] = int(m.group(1)), int(m.group(2))

    ingest = bench.start_ingest("prune")
    try:
        # A new ingest's first seconds (connections, plans) are not what is measured.
        provider_run(ingest, "prune-warmup", rps=rps, secs=2.0)
        bench.db.undo_run()
        base = prune_window(bench, ingest, "prune-baseline", rps, CFG["half_secs"])
        bench.db.undo_run()
        during = prune_window(bench, ingest, "prune-during", rps,
                              CFG["prune_timeout_secs"] + 30, prune)
    finally:
        ingest.stop()
    rows, left = pruned["outbox_rows"] + pruned["processed_events"], sum(prunable(bench))
    log(f"  prune deleted {rows:,} rows in {pruned['secs']}s ({left:,} left); p99 "
        f"{base['p99_ms']} ms before, {during['p99_ms']} ms during")
    if (pruned["outbox_rows"], pruned["processed_events"]) != (outbox_rows, events) or left:
        bench.errors["prune_rows"] = f"prune deleted {pruned} of {outbox_rows:,} and {events:,}"
    bench.details["prune"] = {"prune": pruned, "baseline": base, "during": during}
    r.update(ingest_p99_ms_baseline_prune=base["p99_ms"], prune_secs=pruned["secs"],
             ingest_p99_ms_during_prune=during["p99_ms"], prune_load_rps=during["requests_per_s"],
             prune_rows=rows, prune_rows_per_s=round(rows / max(pruned["secs"], 0.01)))


def prunable(bench: Bench) -> tuple[int, int]:
    """Outbox rows and processed events past the retention (what prune deletes)."""
    old = f"< now() - interval '{RETENTION_DAYS} days'"
    return tuple(int(x) for x in bench.db.sql(PRODUCT, f"""
SELECT count(*) FROM outbox WHERE status IN ('done', 'cancelled') AND finished_at {old};
SELECT count(*) FROM processed_events WHERE processed_at {old};""", timeout=300))


def prune_window(bench: Bench, ingest: Service, tag: str, rps: float, secs: float, during=None):
    """One open-loop run, for `secs` or until `during` returns, with the WAL written."""
    wal = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
    wal0 = int(bench.db.sql(PRODUCT, wal)[0])
    s = provider_run(ingest, tag, during=during, rps=rps, secs=secs)
    s["wal_mb"] = round((int(bench.db.sql(PRODUCT, wal)[0]) - wal0) / 1e6, 1)
    return s


def time_claim(bench: Bench, label: str) -> float | None:
    """The relay's claim from its file (prepared, batch 50, from the start of the due rows:
    the dearer of its two forms), 12 times rolled back: the median of the last 7, in ms."""
    claim = ROOT / "crates" / "outbox-relay" / "src" / "storage" / "claim.sql"
    claim = claim.read_text().strip().rstrip(";")
    # batch size, lease owner, lease in ms, RELAY_MAX_ATTEMPTS, earliest due time
    run = "BEGIN; EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_claim(50, 'bench-claim', 60000, 25, "
    run += "NULL); ROLLBACK;\n"
    prepare = f"PREPARE bench_claim(int8, text, int8, int4, float8) AS {claim};\n"
    out = "\n".join(bench.db.sql(PRODUCT, prepare + 12 * run, timeout=300))
    times = [float(x) for x in re.findall(r"Execution Time: ([\d.]+) ms", out)]
    median = round(statistics.median(times[-7:]), 3) if times else None
    log(f"  claim ({label}): {median} ms")
    return median


def run_growth(bench: Bench) -> None:
    done_rows, r = CFG["growth_outbox_done"], bench.report
    if bench.ingest:
        bench.ingest.stop()
        bench.ingest = None
    bench.db.sql(PRODUCT, "TRUNCATE processed_events, outbox;")
    generate(bench.db, "outbox", history_outbox_sql, 1, done_rows // 2, done_rows // 2)
    have, sizes = 0, CFG["growth_histories"]
    for size in sizes:
        t = time.monotonic()
        generate(bench.db, "processed_events", history_events_sql, have + 1, size, sizes[-1])
        bench.db.undo_run()
        log(f"  history of {size:,} events made in {time.monotonic() - t:.0f}s")
        claim_idle = time_claim(bench, f"{size:,} events, nothing due")
        s = bench.run_new_ingest(f"growth-{size}", CFG["growth_secs"])
        claim = time_claim(bench, f"{size:,} events, after the run")
        bench.details.setdefault("growth", []).append({"history_events": size, "ingest": s})
        label, have = hlabel(size), size
        r.update({f"ingest_rps_c64_{label}_history": s["requests_per_s"],
                  f"ingest_p99_ms_c64_{label}_history": s["p99_ms"],
                  f"claim_ms_{label}_history": claim, f"claim_ms_idle_{label}_history": claim_idle})
    r["growth_history_sizes"] = list(sizes)
    # In quick mode, the largest history stands in for 10M.
    r.setdefault("ingest_rps_c64_10m_history", r[f"ingest_rps_c64_{hlabel(sizes[-1])}_history"])
