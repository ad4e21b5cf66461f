"""The `peer` phase (runner.PHASES): graphile-worker on bench_peer. Each
drain's CPU by process is measured from the moment its jobs are queued."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

from .common import PROCS, clean_env, ratio
from .config import CFG, LOGS, OUT, BenchError, log
from .cpu_split import Split, brief, per_unit
from .load import parse_summary
from .services import read_line

if TYPE_CHECKING:
    from .runner import Bench

PEER_DB = "bench_peer"


def drain(bench: Bench, tag: str, extra: list, pids: dict[str, int], jobs: int | None = None) -> dict:
    """One peer run: its jobs (`peer_jobs` unless given) queued, then drained
    inside a CPU split."""
    jobs = jobs or CFG["peer_jobs"]
    args = ["node", "peer.js", "--jobs", jobs, "--concurrency", 24, "--wait", *extra]
    p = PROCS.popen(tag, args, cwd=OUT / "peer", env=clean_env({"DATABASE_URL": bench.db.url(PEER_DB)}),
                    text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = read_line(p, timeout=300)
        if '"queued"' not in line:
            out, err = p.communicate(timeout=10)
            raise BenchError(f"{tag}: expected its queued line, got {line!r}: {(err or out)[-1000:]}")
        split = Split(bench, PEER_DB, pids).start()
        assert p.stdin
        p.stdin.write("go\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=600)
        cpu = split.stop()
    except subprocess.TimeoutExpired:
        raise BenchError(f"{tag} did not finish within 600s")
    finally:
        PROCS.stop(p)
    (LOGS / f"{tag}.log").write_text(line + out + err)
    if p.returncode != 0:
        raise BenchError(f"{tag} exited {p.returncode}: {(err or out).strip()[-2000:]}")
    res = parse_summary(out, tag)
    res["machine_cores_busy"] = cpu["machine_cores_busy"]
    # The node process's CPU over the drain alone, as it measured it.
    cpu["cpu_secs"]["peer (node)"] = res.get("drain_cpu_secs", 0.0)
    res["cpu_us_per_job"] = per_unit(cpu, jobs)
    return res


def run(bench: Bench) -> None:
    if bench.peer_error:
        raise BenchError(bench.peer_error)
    jobs = CFG["peer_jobs"]
    res = drain(bench, "peer", [], {})
    bench.details["peer"] = res
    bench.report["peer_jobs_per_s"] = res["jobs_per_s"]
    bench.report["relay_vs_peer"] = ratio(bench.report.get("relay_rows_per_s_1"), res["jobs_per_s"])
    log(f"  peer (graphile-worker {res.get('version')}): {jobs:,} jobs in {res['seconds']}s = "
        f"{res['jobs_per_s']:,} jobs/s")
    # Like for like with the relay's drain: each job POSTs to the same
    # zero-latency downstream, with an idempotency key and the relay's body.
    bench.services.reset_downstream()
    downstream = bench.services.downstream
    http = drain(bench, "peer-http", ["--http", bench.services.downstream_url],
                 {"downstream": downstream.pid} if downstream else {})
    http["downstream_effects"] = bench.services.stats()["effects"]
    bench.details["peer_http"] = http
    bench.report["peer_http_jobs_per_s"] = http["jobs_per_s"]
    bench.report["relay_vs_peer_http"] = ratio(bench.report.get("relay_rows_per_s_1"), http["jobs_per_s"])
    log(f"  peer, each job a POST to the downstream: {jobs:,} jobs in {http['seconds']}s = "
        f"{http['jobs_per_s']:,} jobs/s ({http['downstream_effects']:,} effects)")
    bench.details["relay_bound"] = b = relay_bound(bench, res, http)
    bench.report["relay_vs_peer_ceiling"] = b.get("ceiling")
    if b:
        log(f"  cpu us per row, relay drain 1: {brief(b['relay_us_per_row'])} | per job, peer no-op: "
            f"{brief(b['peer_us_per_job'])}; with the POST: {brief(b['peer_http_us_per_job'])} | relay/peer "
            f"ceiling {b['ceiling']} (model {b['model']}, measured {bench.report.get('relay_vs_peer')})")


def relay_bound(bench: Bench, peer: dict, http: dict) -> dict:
    """What one relay can reach against the no-op peer on these cores. Both
    drains are CPU-bound, so a ratio of rates is about the inverse ratio of
    CPU per row (`model`, beside the measured one). `ceiling`: a relay whose
    database work and own process cost no more than the peer's no-op jobs,
    and which adds to that only the downstream's own CPU for the call each
    row is (its server; the client side of the call counted as free)."""
    drains = (bench.details.get("relay") or {}).get("drains_one_relay") or []
    ours = drains[0].get("cpu_us_per_row") if drains else None
    noop, post = peer.get("cpu_us_per_job") or {}, http.get("cpu_us_per_job") or {}
    if not ours or not ours.get("total") or not noop.get("total"):
        return {}
    return {"relay_us_per_row": ours, "peer_us_per_job": noop, "peer_http_us_per_job": post,
            "model": round(noop["total"] / ours["total"], 3),
            "ceiling": round(noop["total"] / (noop["total"] + ours.get("downstream", 0.0)), 3),
            "database_us_per_row_vs_peer": ratio(ours["postgres"], noop["postgres"]),
            "peer_call_us_per_job": round(post["total"] - noop["total"], 1) if post.get("total") else None}
