"""Phases 2 and 3: the ingest in a closed loop at 1, 16 and 64 senders,
each beside pgbench running the two reference files; then an open loop at
half of the peak."""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

from .common import pct, ratio, run_cmd
from .config import CFG, CONCURRENCIES, DUPLICATE_RATE, LOGS, REFS, BenchError, log
from .db import Db, Product, Reference
from .db_cpu import Split, per_unit
from .services import Bench, provider_run, summary_brief


def pgbench(db: Db, file: str, clients: int, secs: float, tag: str) -> dict:
    """pgbench on one reference file at `clients`, from bench_ref's reset state."""
    with tempfile.TemporaryDirectory() as logs:
        args = ["pgbench", "-n", "-M", "prepared", "-c", clients, "-j", min(2, clients), "-T", max(1, round(secs)),
                "-D", f"run={time.time_ns()}", "-D", "n=0", "-f", REFS / file,
                # A sample of per-transaction latencies, for p50/p99 beside ours.
                "-l", "--sampling-rate=0.2", f"--log-prefix={logs}/tx", db.url(Reference.DB)]
        _, out, err = run_cmd(f"pgbench {tag}", args, timeout=secs + 120, env=db.env())
        lat = [int(line.split()[2]) / 1000.0 for f in Path(logs).iterdir() for line in f.read_text().splitlines()]
    (LOGS / f"pgbench-{tag}.out").write_text(out + err)
    m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    done = re.search(r"number of transactions actually processed: (\d+)", out)
    if not m or not done:
        raise BenchError(f"pgbench {tag}: no tps in its output: {out[-500:]}")
    return {"tps": float(m.group(1)), "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
            "transactions": int(done.group(1))}


def run(bench: Bench) -> None:
    secs, r = CFG["ingest_secs"], bench.report
    bench.ingest = bench.start_ingest("main")
    runs: dict = {}
    for c in CONCURRENCIES:
        bench.product.reset(CFG["product_history"])
        # No relay runs here (the references do not drain either): the
        # outbox's pending rows grow through the run.
        split = Split(bench, Product.DB, {"ingest": bench.ingest.p.pid}, "load generator").start()
        ours = summary_brief(provider_run(bench.ingest, f"c{c}", concurrency=c, secs=secs))
        ours["cpu_us_per_request"] = per_unit(split.stop(), ours["deliveries"] or 0)
        refs = {}
        for name, file in (("reference", "reference-ingest.sql"),
                           ("one_statement", "reference-ingest-one-statement.sql")):
            bench.ref.reset()
            split = Split(bench, Reference.DB, {}, "pgbench").start()
            refs[name] = pgbench(bench.db, file, c, secs, f"{name}-c{c}")
            refs[name]["cpu_us_per_transaction"] = per_unit(split.stop(), refs[name]["transactions"])
        b = bound(ours, refs["one_statement"])
        runs[c] = {"ours": ours, **refs, "bound": b}
        log(f"  c{c:<3} ours {ours['requests_per_s']:>8,.0f} req/s  p99 {ours['p99_ms']} ms | reference "
            f"{refs['reference']['tps']:>8,.0f} tps | one statement {refs['one_statement']['tps']:>8,.0f} tps | "
            f"ceiling {b.get('ceiling')} (model {b.get('model')}) {ours.get('problems', '')}")
        for key, v in (("ingest_rps", ours["requests_per_s"]), ("ingest_p50_ms", ours["p50_ms"]),
                       ("ingest_p99_ms", ours["p99_ms"]), ("ingest_new_events_per_s", ours["new_events_per_s"]),
                       *((f"{name}_{k}", refs[name][k]) for name in refs for k in ("tps", "p50_ms", "p99_ms")),
                       ("ingest_vs_reference", ratio(ours["requests_per_s"], refs["reference"]["tps"])),
                       ("ingest_vs_one_statement", ratio(ours["requests_per_s"], refs["one_statement"]["tps"])),
                       ("ingest_vs_one_statement_ceiling", b.get("ceiling"))):
            r[f"{key}_c{c}"] = v
    bench.details["ingest"] = runs
    pairs_against_naive(bench, runs[PAIRED]["ours"]["requests_per_s"], runs[PAIRED]["reference"]["tps"])


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
        order = ("naive", "ours") if i % 2 else ("ours", "naive")
        pair = {"order": f"{order[0]} first"}
        for side in order:
            if side == "ours":
                bench.product.reset(CFG["product_history"])
                pair["ours"] = summary_brief(provider_run(bench.ingest, f"c{PAIRED}-pair{i}", concurrency=PAIRED,
                                                          secs=secs))["requests_per_s"]
            else:
                bench.ref.reset()
                pair["naive"] = pgbench(bench.db, "reference-ingest.sql", PAIRED, secs, f"c{PAIRED}-pair{i}")["tps"]
        pairs.append(pair)
    for pair in pairs:
        pair["ratio"] = ratio(pair["ours"], pair["naive"])
    ratios = sorted(p["ratio"] for p in pairs if p["ratio"] is not None)
    r = bench.report
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
    Postgres."""
    a, b = ours.get("cpu_us_per_request") or {}, ref.get("cpu_us_per_transaction") or {}
    if not a.get("total") or not b.get("total"):
        return {}
    return {"model": round(b["total"] / a["total"], 3),
            "ceiling": round(b["total"] / (b["postgres"] + a["total"] - a["postgres"]), 3)}


def run_half_load(bench: Bench) -> None:
    if not bench.ingest:
        raise BenchError("the ingest is not running")
    peak = bench.peak_rps()
    # --rate is events/s; 10% of events are delivered twice.
    rate = peak / 2 / (1 + DUPLICATE_RATE)
    bench.product.reset(CFG["product_history"])
    s = bench.details["half_load"] = summary_brief(provider_run(bench.ingest, "half", rate=rate, secs=CFG["half_secs"]))
    r = bench.report
    r["ingest_p99_ms_half_load"], r["ingest_p50_ms_half_load"] = s["p99_ms"], s["p50_ms"]
    r["half_load_rps"], r["half_load_status_counts"] = s["requests_per_s"], s["status_counts"]
    log(f"  half load {s['requests_per_s']:,.0f} req/s (target {peak / 2:,.0f}): p50 {s['p50_ms']} "
        f"p99 {s['p99_ms']} p99.9 {s['p999_ms']} ms")
