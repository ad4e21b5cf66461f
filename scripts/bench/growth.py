"""The `growth` phase (runner.PHASES): the ingest and the relay's claim over
a growing history; a history the time budget cannot generate is cut, and the
report says so."""

from __future__ import annotations

import re
import statistics
import time
from typing import TYPE_CHECKING

from .common import hlabel
from .config import CFG, ROOT, T0, BenchError, log
from .db import Product
from .history import generate, history_events_sql, history_outbox_sql
from .load import provider_run, summary_brief
from .prune import undo_run

if TYPE_CHECKING:
    from .runner import Bench


def claim_sql(bench: Bench) -> str:
    """The relay's claim statement, read from its file so the bench times
    exactly what the relay runs."""
    path = ROOT / "crates" / "outbox-relay" / "src" / "storage" / "claim.sql"
    if not path.exists():
        raise BenchError(f"the relay's claim statement is not at {path}")
    return path.read_text().strip().rstrip(";")


def time_claim(bench: Bench, label: str) -> dict:
    """The relay's claim as the relay runs it (a prepared statement, batch 50),
    12 times, each rolled back; median of the last 7 (generic plan by then).
    It is the claim from the start of the due rows (no floor), the one the
    relay runs once per poll interval: the dearer of its two forms."""
    claim = claim_sql(bench)
    # batch size, lease owner, lease in ms, RELAY_MAX_ATTEMPTS, earliest due time
    parts = [f"PREPARE bench_claim(int8, text, int8, int4, float8) AS {claim};"]
    for _ in range(12):
        parts.append("BEGIN; EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_claim(50, 'bench-claim', 60000, 25, NULL); "
                     "ROLLBACK;")
    parts.append("SELECT 'pending=' || count(*) FROM outbox WHERE status = 'pending';")
    parts.append("SELECT 'done=' || count(*) FROM outbox WHERE status = 'done';")
    out = bench.db.sql(Product.DB, "\n".join(parts), timeout=300)
    times = [float(x) for x in re.findall(r"Execution Time: ([\d.]+) ms", "\n".join(out))]
    plans, cur = [], []
    for line in out:
        cur.append(line)
        if line.startswith("Execution Time"):
            plans.append(cur)
            cur = []
    counts = dict(x.split("=", 1) for x in out if re.match(r"^(pending|done)=\d+$", x))
    res = {"median_ms": round(statistics.median(times[-7:]), 3) if times else None,
           "all_ms": times, "pending_rows": int(counts.get("pending", -1)),
           "done_rows": int(counts.get("done", -1)), "plan": plans[-1] if plans else []}
    log(f"  claim ({label}): {res['median_ms']} ms with {res['pending_rows']:,} pending and "
        f"{res['done_rows']:,} done rows")
    return res


def run(bench: Bench) -> None:
    h1, h2 = CFG["growth_histories"]
    done_rows = CFG["growth_outbox_done"]
    secs = CFG["growth_secs"]
    if bench.ingest:
        bench.ingest.stop()
        bench.ingest = None
    results = []
    bench.db.sql(Product.DB, "TRUNCATE processed_events, outbox;")
    have = 0
    rate = None  # history rows generated per second (indexes rebuilt included)
    sizes = [h1, h2]
    for i in range(2):
        target = sizes[i]
        if i == 1 and rate:
            # The run must end within its budget: a history the time left
            # cannot generate is cut to what it can, and the report says so.
            left = CFG["budget_secs"] - (time.monotonic() - T0)
            # vacuum (grows with the table), the run, the ingest's start and the claims
            fixed = results[0]["vacuum_secs"] * (h2 / h1) ** 0.5 + secs + 8
            step = 1_000_000 if h2 >= 2_000_000 else 100_000
            fits = int((h1 + max(0.0, left - fixed) * rate / 1.15) // step * step)
            if fits < h2:
                target = sizes[1] = max(fits, 0)
                note = (f"history cut from {h2:,} to {target:,} events to end within "
                        f"{CFG['budget_secs']} s (generating ran at {rate:,.0f} rows/s)")
                bench.report["growth_cut"] = note
                log(f"  {note}")
                if target <= h1:
                    break
        gen_events = generate(bench, "processed_events", history_events_sql, have + 1, target, h2)
        rate = (target - have) / max(gen_events, 0.1)
        have = target
        gen_outbox = None
        if i == 0:
            gen_outbox = generate(bench, "outbox", history_outbox_sql, 1, done_rows // 2, done_rows // 2)
        t_vac = time.monotonic()
        undo_run(bench, timeout=1200)
        vac = round(time.monotonic() - t_vac, 1)
        size = bench.db.one(Product.DB, "SELECT pg_size_pretty(pg_total_relation_size('processed_events')) "
                                       "|| ' / ' || pg_size_pretty(pg_total_relation_size('outbox'))")
        log(f"  history {target:,} events + {done_rows:,} done outbox rows ({size}): "
            f"events generated in {gen_events}s ({rate:,.0f} rows/s)"
            + (f", outbox rows in {gen_outbox}s" if gen_outbox else "") + f", vacuum {vac}s")
        claim_idle = time_claim(bench, f"{target:,} events, nothing due")
        ingest = bench.services.start_ingest(f"growth-{target}")
        try:
            s = summary_brief(provider_run(ingest.url, f"growth-{target}", ingest, concurrency=64, secs=secs))
        finally:
            ingest.stop()
        claim = time_claim(bench, f"{target:,} events, after the run")
        label = hlabel(target)
        log(f"  c64 with {target:,} events of history: {s['requests_per_s']:,.0f} req/s, p50 {s['p50_ms']} "
            f"p99 {s['p99_ms']} ms")
        results.append({"history_events": target, "done_outbox_rows": done_rows, "sizes": size,
                        "generate_events_secs": gen_events, "generate_rows_per_s": round(rate),
                        "generate_outbox_secs": gen_outbox, "vacuum_secs": vac, "ingest": s,
                        "claim_nothing_due": claim_idle, "claim_after_run": claim})
        bench.report[f"ingest_rps_c64_{label}_history"] = s["requests_per_s"]
        bench.report[f"ingest_p99_ms_c64_{label}_history"] = s["p99_ms"]
        bench.report[f"claim_ms_{label}_history"] = claim["median_ms"]
        bench.report[f"claim_ms_idle_{label}_history"] = claim_idle["median_ms"]
    bench.details["growth"] = results
    bench.report["growth_history_sizes"] = [r["history_events"] for r in results]
    last = results[-1]["history_events"]
    if last != 10_000_000:
        shown = " and ".join(f"{r['history_events']:,}" for r in results)
        bench.report["growth_note"] = (f"{CFG['mode']} mode: histories of {shown} events; "
                                      f"ingest_rps_c64_10m_history is the {last:,} figure")
        bench.report["ingest_rps_c64_10m_history"] = bench.report.get(f"ingest_rps_c64_{hlabel(last)}_history")
