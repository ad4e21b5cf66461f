"""Phases 2 and 3: the ingest in a closed loop at 1, 16 and 64 senders,
each beside pgbench running the two reference files; then an open loop at
half of the peak."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .common import CpuMeter, pct, ratio, run_cmd
from .cpu_split import Split, brief, per_unit
from .config import BENCH_REFERENCES, CFG, CONCURRENCIES, DUPLICATE_RATE, LOGS, BenchError, log
from .db import Db, Product, Reference
from .load import provider_run, summary_brief

if TYPE_CHECKING:
    from .runner import Bench


def pgbench(db: Db, file: Path, clients: int, secs: float, tag: str) -> dict:
    prefix = LOGS / f"pgbench-{tag}"
    for old in LOGS.glob(f"pgbench-{tag}.*"):
        old.unlink()
    args = ["pgbench", "-n", "-M", "prepared", "-c", clients, "-j", min(2, clients), "-T", max(1, round(secs)),
            "-D", f"run={time.time_ns()}", "-D", "n=0", "-f", file,
            # A sample of per-transaction latencies, for p50/p99 beside ours.
            "-l", "--sampling-rate=0.2", f"--log-prefix={prefix}", db.url(Reference.DB)]
    meter = CpuMeter()
    _, out, err = run_cmd(f"pgbench {tag}", args, timeout=secs + 120, env=db.env())
    cores = meter.cores_busy()
    (LOGS / f"pgbench-{tag}.out").write_text(out + err)
    m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    if not m:
        raise BenchError(f"pgbench {tag}: no tps in its output: {out[-500:]}")
    done = re.search(r"number of transactions actually processed: (\d+)", out)
    failed = re.search(r"number of failed transactions: (\d+)", out)
    lat = []
    for f in LOGS.glob(f"pgbench-{tag}.*"):
        if f.suffix == ".out":
            continue
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3:
                lat.append(int(parts[2]) / 1000.0)
        f.unlink()
    return {"tps": float(m.group(1)), "p50_ms": pct(lat, 50), "p90_ms": pct(lat, 90), "p99_ms": pct(lat, 99),
            "p999_ms": pct(lat, 99.9), "max_ms": max(lat) if lat else None,
            "failed": int(failed.group(1)) if failed else None, "machine_cores_busy": cores,
            "latency_samples": len(lat), "transactions": int(done.group(1)) if done else None}


def run(bench: Bench) -> None:
    secs = CFG["ingest_secs"]
    bench.ingest = bench.services.start_ingest("main")
    runs: dict = {}
    for c in CONCURRENCIES:
        bench.product.reset(CFG["product_history"])
        analyzes0 = outbox_analyzes(bench)
        split = Split(bench, Product.DB, {"ingest": bench.ingest.p.pid}, "load generator").start()
        ours = summary_brief(provider_run(bench.ingest.url, f"c{c}", bench.ingest, concurrency=c, secs=secs))
        ours["cpu_us_per_request"] = per_unit(split.stop(), ours["deliveries"] or 0)
        # An autoanalyze of the outbox during the run re-plans the ingest's statement.
        ours["outbox_autoanalyzes"] = outbox_analyzes(bench) - analyzes0
        # No relay runs here (the references do not drain either): the
        # outbox's pending rows grow through the run.
        ours["outbox_pending_after"] = int(bench.db.one(
            Product.DB, "SELECT count(*) FROM outbox WHERE status = 'pending'"))
        ref_runs = {}
        for name, file in (("reference", "reference-ingest.sql"),
                           ("one_statement", "reference-ingest-one-statement.sql")):
            bench.ref.reset()
            split = Split(bench, Reference.DB, {}, "pgbench").start()
            ref_runs[name] = pgbench(bench.db, BENCH_REFERENCES / file, c, secs, f"{name}-c{c}")
            ref_runs[name]["cpu_us_per_transaction"] = per_unit(split.stop(), ref_runs[name]["transactions"] or 0)
        runs[c] = {"ours": ours, **ref_runs, "bound": bound(ours, ref_runs["one_statement"])}
        log(f"  c{c:<3} ours {ours['requests_per_s']:>8,.0f} req/s  p50 {ours['p50_ms']} p99 {ours['p99_ms']} ms"
            f" ({ours['outbox_pending_after']:,} pending outbox rows at the end, "
            f"{ours['outbox_autoanalyzes']} autoanalyze)"
            f" | reference {ref_runs['reference']['tps']:>8,.0f} tps | one statement "
            f"{ref_runs['one_statement']['tps']:>8,.0f} tps"
            + (f"  PROBLEMS {ours['problems']}" if ours.get("problems") else ""))
        r = bench.report
        r[f"ingest_rps_c{c}"] = ours["requests_per_s"]
        r[f"ingest_p50_ms_c{c}"] = ours["p50_ms"]
        r[f"ingest_p99_ms_c{c}"] = ours["p99_ms"]
        r[f"ingest_new_events_per_s_c{c}"] = ours["new_events_per_s"]
        r[f"reference_tps_c{c}"] = ref_runs["reference"]["tps"]
        r[f"reference_p50_ms_c{c}"] = ref_runs["reference"]["p50_ms"]
        r[f"reference_p99_ms_c{c}"] = ref_runs["reference"]["p99_ms"]
        r[f"one_statement_tps_c{c}"] = ref_runs["one_statement"]["tps"]
        r[f"one_statement_p50_ms_c{c}"] = ref_runs["one_statement"]["p50_ms"]
        r[f"one_statement_p99_ms_c{c}"] = ref_runs["one_statement"]["p99_ms"]
        r[f"ingest_vs_reference_c{c}"] = ratio(ours["requests_per_s"], ref_runs["reference"]["tps"])
        r[f"ingest_vs_one_statement_c{c}"] = ratio(ours["requests_per_s"], ref_runs["one_statement"]["tps"])
        r[f"ingest_vs_one_statement_ceiling_c{c}"] = runs[c]["bound"].get("ceiling")
        log(f"       cpu us per request: {brief(ours['cpu_us_per_request'])} | one statement per "
            f"transaction: {brief(ref_runs['one_statement']['cpu_us_per_transaction'])} | ceiling "
            f"{runs[c]['bound'].get('ceiling')} (model {runs[c]['bound'].get('model')}, measured "
            f"{r[f'ingest_vs_one_statement_c{c}']})")
    bench.details["ingest"] = runs
    pairs_against_naive(bench, runs[PAIRED]["ours"]["requests_per_s"], runs[PAIRED]["reference"]["tps"])
    # Memory after the closed-loop runs alone (the open-loop phases next may overload it).
    bench.report["ingest_rss_mib_closed_loop"] = bench.ingest.rss().get("peak_mib")


# The concurrency whose ratio to the naive reference is a target, and how
# many (ours, naive) pairs measure it.
PAIRED = 64
PAIRS = 3


def pairs_against_naive(bench: Bench, ours_rps: float, naive_tps: float) -> None:
    """`ingest_vs_reference_c64` is the median of PAIRS pairs of adjacent
    runs, the first pair the loop's (ours first), then naive first, then ours
    first again. The two sides of a pair run seconds apart, and this machine's
    speed drifts by more than the margin between them: in one afternoon the
    same ingest run ranged 1,279 to 1,872 req/s within two minutes, its CPU
    per request with it. A single pair's ratio is that drift as much as the
    designs; the median of alternated pairs cancels a drift in either
    direction and shows its spread (`_min`, `_max`)."""
    secs = CFG["ingest_secs"]
    pairs = [{"order": "ours first", "ours": ours_rps, "naive": naive_tps}]
    for i in range(1, PAIRS):
        pair = {"order": "naive first" if i % 2 else "ours first"}
        for side in (("naive", "ours") if i % 2 else ("ours", "naive")):
            if side == "ours":
                bench.product.reset(CFG["product_history"])
                s = summary_brief(provider_run(bench.ingest.url, f"c{PAIRED}-pair{i}", bench.ingest,
                                               concurrency=PAIRED, secs=secs))
                pair["ours"] = s["requests_per_s"]
                if s.get("problems"):
                    pair["problems"] = s["problems"]
            else:
                bench.ref.reset()
                pair["naive"] = pgbench(bench.db, BENCH_REFERENCES / "reference-ingest.sql", PAIRED, secs,
                                        f"reference-c{PAIRED}-pair{i}")["tps"]
        pairs.append(pair)
    for pair in pairs:
        pair["ratio"] = ratio(pair["ours"], pair["naive"])
    ratios = sorted(p["ratio"] for p in pairs if p["ratio"] is not None)
    r = bench.report
    r[f"ingest_vs_reference_c{PAIRED}_first_pair"] = pairs[0]["ratio"]
    if ratios:
        r[f"ingest_vs_reference_c{PAIRED}"] = ratios[len(ratios) // 2]
        r[f"ingest_vs_reference_c{PAIRED}_min"] = ratios[0]
        r[f"ingest_vs_reference_c{PAIRED}_max"] = ratios[-1]
    bench.details[f"ingest_vs_reference_c{PAIRED}_pairs"] = pairs
    log(f"  c{PAIRED} against the naive reference, {len(pairs)} pairs: "
        + ", ".join(f"{p['ours']:,.0f}/{p['naive']:,.0f} = {p['ratio']} ({p['order']})" for p in pairs)
        + f"; median {r.get(f'ingest_vs_reference_c{PAIRED}')}")


def bound(ours: dict, ref: dict) -> dict:
    """What the ratio to the one-statement reference can reach on these
    cores. Both runs are CPU-bound, so a ratio of throughputs is about the
    inverse ratio of CPU per unit of work (`model`, beside the measured
    one). `ceiling`: the same with our Postgres CPU per request replaced by
    the reference's per transaction, the ingest process and the load
    generator kept: an ingest whose database work cost no more than a
    statement that writes less than the contract asks (no payload, no
    stored result, no row lock, fewer indexes) could reach that much and no
    more while the load generator and the ingest share the cores with
    Postgres. `ceiling_ingest_process_only`: the load generator's CPU, too,
    replaced by pgbench's own."""
    a, b = ours.get("cpu_us_per_request") or {}, ref.get("cpu_us_per_transaction") or {}
    if not a.get("total") or not b.get("total"):
        return {}
    others = a["total"] - a["postgres"]
    return {"ours_us": a["total"], "reference_us": b["total"],
            "model": round(b["total"] / a["total"], 3),
            "ceiling": round(b["total"] / (b["postgres"] + others), 3),
            # And with a load generator as cheap as pgbench's client: the ingest process alone.
            "ceiling_ingest_process_only": round(
                b["total"] / (b["postgres"] + b.get("pgbench", 0.0) + a.get("ingest", 0.0)), 3)}


def outbox_analyzes(bench: Bench) -> int:
    return int(bench.db.one(Product.DB, "SELECT autoanalyze_count FROM pg_stat_user_tables "
                                       "WHERE relname = 'outbox'") or 0)


def run_half_load(bench: Bench) -> None:
    if not bench.ingest:
        raise BenchError("the ingest is not running")
    peak = bench.peak_rps()
    # --rate is events/s; 10% of events are delivered twice.
    rate = peak / 2 / (1 + DUPLICATE_RATE)
    bench.product.reset(CFG["product_history"])
    s = summary_brief(provider_run(bench.ingest.url, "half", bench.ingest, rate=rate, secs=CFG["half_secs"]))
    s["target_requests_per_s"] = round(peak / 2, 1)
    s["events_rate"] = round(rate, 1)
    bench.details["half_load"] = s
    bench.report["ingest_p99_ms_half_load"] = s["p99_ms"]
    bench.report["ingest_p50_ms_half_load"] = s["p50_ms"]
    bench.report["half_load_rps"] = s["requests_per_s"]
    bench.report["half_load_status_counts"] = s.get("status_counts")
    log(f"  half load {s['requests_per_s']:,.0f} req/s (target {peak / 2:,.0f}): p50 {s['p50_ms']} "
        f"p99 {s['p99_ms']} p99.9 {s['p999_ms']} ms")
