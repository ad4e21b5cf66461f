"""The `growth` phase (runner.PHASES): the ingest and the relay's claim over
a growing history."""

from __future__ import annotations

import re
import statistics
import time

from .common import hlabel
from .config import CFG, ROOT, log
from .db import Product, generate, history_events_sql, history_outbox_sql
from .services import Bench, provider_run, summary_brief


def time_claim(bench: Bench, label: str) -> float | None:
    """The relay's claim as the relay runs it (a prepared statement, batch 50),
    12 times, each rolled back; median of the last 7 ms (generic plan by then).
    It is the claim from the start of the due rows (no floor), the one the
    relay runs once per poll interval: the dearer of its two forms."""
    # The relay's claim statement, read from its file so the bench times
    # exactly what the relay runs.
    claim = (ROOT / "crates" / "outbox-relay" / "src" / "storage" / "claim.sql").read_text().strip().rstrip(";")
    # batch size, lease owner, lease in ms, RELAY_MAX_ATTEMPTS, earliest due time
    run = "BEGIN; EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_claim(50, 'bench-claim', 60000, 25, NULL); ROLLBACK;\n"
    out = bench.db.sql(Product.DB, f"PREPARE bench_claim(int8, text, int8, int4, float8) AS {claim};\n" + 12 * run,
                       timeout=300)
    times = [float(x) for x in re.findall(r"Execution Time: ([\d.]+) ms", "\n".join(out))]
    median = round(statistics.median(times[-7:]), 3) if times else None
    log(f"  claim ({label}): {median} ms")
    return median


def run(bench: Bench) -> None:
    done_rows, secs, r = CFG["growth_outbox_done"], CFG["growth_secs"], bench.report
    if bench.ingest:
        bench.ingest.stop()
        bench.ingest = None
    bench.db.sql(Product.DB, "TRUNCATE processed_events, outbox;")
    generate(bench.db, "outbox", history_outbox_sql, 1, done_rows // 2, done_rows // 2)
    have, total = 0, CFG["growth_histories"][-1]
    for target in CFG["growth_histories"]:
        t = time.monotonic()
        generate(bench.db, "processed_events", history_events_sql, have + 1, target, total)
        bench.product.undo_run()
        log(f"  history {target:,} events + {done_rows:,} done outbox rows: made in {time.monotonic() - t:.0f}s")
        claim_idle = time_claim(bench, f"{target:,} events, nothing due")
        ingest = bench.start_ingest(f"growth-{target}")
        try:
            s = summary_brief(provider_run(ingest, f"growth-{target}", concurrency=64, secs=secs))
        finally:
            ingest.stop()
        claim = time_claim(bench, f"{target:,} events, after the run")
        log(f"  c64 with {target:,} events of history: {s['requests_per_s']:,.0f} req/s, p99 {s['p99_ms']} ms")
        bench.details.setdefault("growth", []).append({"history_events": target, "ingest": s})
        label, have = hlabel(target), target
        r[f"ingest_rps_c64_{label}_history"], r[f"ingest_p99_ms_c64_{label}_history"] = s["requests_per_s"], s["p99_ms"]
        r[f"claim_ms_{label}_history"], r[f"claim_ms_idle_{label}_history"] = claim, claim_idle
    r["growth_history_sizes"] = list(CFG["growth_histories"])
    if total != 10_000_000:
        shown = " and ".join(f"{x:,}" for x in CFG["growth_histories"])
        r["growth_note"] = (f"{CFG['mode']} mode: histories of {shown} events; "
                            f"ingest_rps_c64_10m_history is the {total:,} figure")
        r["ingest_rps_c64_10m_history"] = r[f"ingest_rps_c64_{hlabel(total)}_history"]
