"""The `ingest` and `half_load` phases: closed loops beside pgbench, an open loop."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from .common import CFG, CONCURRENCIES, REFS, BenchError, log, pct, ratio
from .db import PRODUCT, REFERENCE, Db
from .db_cpu import Split, per_unit
from .services import Bench, provider_run

# The concurrency whose ratio to the naive reference is a target, and the pairs measuring it.
PAIRED, PAIRS = 64, 3


def reference_run(db: Db, file: str, clients: int, secs: float, tag: str) -> dict:
    """One reference file at `clients`: tps, and p50/p99 from a sample of the transactions."""
    with tempfile.TemporaryDirectory() as logs:
        out = db.pgbench(tag, ["-c", clients, "-j", min(2, clients), "-T", max(1, round(secs)),
                                "-f", REFS / file, "-l", "--sampling-rate=0.2",
                                f"--log-prefix={logs}/tx"], secs + 120)
        lat = [int(line.split()[2]) / 1000.0
               for f in Path(logs).iterdir() for line in f.read_text().splitlines()]
    m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    done = re.search(r"number of transactions actually processed: (\d+)", out)
    if not m or not done:
        raise BenchError(f"pgbench {tag}: no tps in its output: {out[-500:]}")
    return {"tps": float(m.group(1)), "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
            "transactions": int(done.group(1))}


def run(bench: Bench) -> None:
    secs, r, runs = CFG["ingest_secs"], bench.report, {}
    bench.ingest = bench.start_ingest("main")
    for c in CONCURRENCIES:
        # No relay runs here (the references do not drain either): the outbox grows.
        bench.db.reset_product(CFG["product_history"])
        split = Split(bench, PRODUCT, {"ingest": bench.ingest.p.pid}, "load generator").start()
        ours = provider_run(bench.ingest, f"c{c}", concurrency=c, secs=secs)
        ours["cpu_us_per_request"] = per_unit(split.stop(), ours["deliveries"] or 0)
        refs = {}
        for name, file in (("reference", "reference-ingest.sql"),
                           ("one_statement", "reference-ingest-one-statement.sql")):
            bench.db.reset_reference()
            split = Split(bench, REFERENCE, {}, "pgbench").start()
            ref = refs[name] = reference_run(bench.db, file, c, secs, f"{name}-c{c}")
            ref["cpu_us_per_transaction"] = per_unit(split.stop(), ref["transactions"])
        b = bound(ours, refs["one_statement"])
        runs[c] = {"ours": ours, **refs, "bound": b}
        rps, naive, one = ours["requests_per_s"], refs["reference"], refs["one_statement"]
        log(f"  c{c}: ours {rps:,.0f} req/s, naive {naive['tps']:,.0f} tps, one statement "
            f"{one['tps']:,.0f} tps; ceiling {b.get('ceiling')}")
        r.update({f"ingest_rps_c{c}": rps, f"ingest_p50_ms_c{c}": ours["p50_ms"],
                  f"ingest_p99_ms_c{c}": ours["p99_ms"],
                  f"ingest_new_events_per_s_c{c}": ours["new_events_per_s"],
                  f"ingest_vs_reference_c{c}": ratio(rps, naive["tps"]),
                  f"ingest_vs_one_statement_c{c}": ratio(rps, one["tps"]),
                  f"ingest_vs_one_statement_ceiling_c{c}": b.get("ceiling")})
        for name, ref in refs.items():
            r.update({f"{name}_{k}_c{c}": ref[k] for k in ("tps", "p50_ms", "p99_ms")})
    bench.details["ingest"] = runs
    pairs_against_naive(bench, runs[PAIRED]["ours"]["requests_per_s"],
                        runs[PAIRED]["reference"]["tps"])


def pairs_against_naive(bench: Bench, ours_rps: float, naive_tps: float) -> None:
    """`ingest_vs_reference_c64`: the median of PAIRS pairs of adjacent runs, the loop's (ours
    first), then naive first, then ours first. The machine's speed drifts by more than the
    margin within minutes; alternated pairs cancel a drift either way (`_min`, `_max`)."""
    secs, key = CFG["ingest_secs"], f"ingest_vs_reference_c{PAIRED}"
    pairs = [{"order": "ours first", "ours": ours_rps, "naive": naive_tps}]
    for i in range(1, PAIRS):
        order = ("naive", "ours") if i % 2 else ("ours", "naive")
        pair, tag = {"order": f"{order[0]} first"}, f"c{PAIRED}-pair{i}"
        for side in order:
            if side == "ours":
                bench.db.reset_product(CFG["product_history"])
                s = provider_run(bench.ingest, tag, concurrency=PAIRED, secs=secs)
                pair["ours"] = s["requests_per_s"]
            else:
                bench.db.reset_reference()
                file = "reference-ingest.sql"
                pair["naive"] = reference_run(bench.db, file, PAIRED, secs, tag)["tps"]
        pairs.append(pair)
    for pair in pairs:
        pair["ratio"] = ratio(pair["ours"], pair["naive"])
    ratios = sorted(p["ratio"] for p in pairs if p["ratio"] is not None)
    if ratios:
        bench.report.update({key: ratios[len(ratios) // 2], f"{key}_min": ratios[0],
                             f"{key}_max": ratios[-1]})
    bench.details[f"{key}_pairs"] = pairs
    log(f"  c{PAIRED} vs naive, pairs: {[p['ratio'] for p in pairs]}")


def bound(ours: dict, ref: dict) -> dict:
    """What the ratio to the one-statement reference can reach on these CPU-bound cores:
    `model`, the inverse ratio of CPU per unit of work; `ceiling`, the same with our Postgres
    CPU per request replaced by the reference's per transaction."""
    a, b = ours.get("cpu_us_per_request") or {}, ref.get("cpu_us_per_transaction") or {}
    if not a.get("total") or not b.get("total"):
        return {}
    return {"model": round(b["total"] / a["total"], 3),
            "ceiling": round(b["total"] / (b["postgres"] + a["total"] - a["postgres"]), 3)}


def run_half_load(bench: Bench) -> None:
    if not bench.ingest:
        raise BenchError("the ingest is not running")
    peak = bench.peak_rps()
    bench.db.reset_product(CFG["product_history"])
    s = provider_run(bench.ingest, "half", rps=peak / 2, secs=CFG["half_secs"])
    bench.details["half_load"] = s
    bench.report.update(ingest_p99_ms_half_load=s["p99_ms"], ingest_p50_ms_half_load=s["p50_ms"],
                        half_load_rps=s["requests_per_s"],
                        half_load_status_counts=s["status_counts"])
    log(f"  half load {s['requests_per_s']:,.0f} req/s: p50 {s['p50_ms']} p99 {s['p99_ms']} ms")
