"""Phase 5: graphile-worker draining as many no-op jobs, on bench_peer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .common import CpuMeter, clean_env, ratio, run_cmd
from .config import CFG, LOGS, OUT, BenchError, log
from .load import parse_summary

if TYPE_CHECKING:
    from .runner import Bench


def run(bench: Bench) -> None:
    if bench.peer_error:
        raise BenchError(bench.peer_error)
    jobs = CFG["peer_jobs"]
    meter = CpuMeter()
    _, out, err = run_cmd("peer", ["node", "peer.js", "--jobs", jobs, "--concurrency", 24], timeout=300,
                          cwd=OUT / "peer", env=clean_env({"DATABASE_URL": bench.db.url("bench_peer")}))
    (LOGS / "peer.log").write_text(out + err)
    res = parse_summary(out, "peer")
    res["machine_cores_busy"] = meter.cores_busy()
    bench.details["peer"] = res
    bench.report["peer_jobs_per_s"] = res["jobs_per_s"]
    bench.report["relay_vs_peer"] = ratio(bench.report.get("relay_rows_per_s_1"), res["jobs_per_s"])
    log(f"  peer (graphile-worker {res.get('version')}): {jobs:,} jobs in {res['seconds']}s = "
        f"{res['jobs_per_s']:,} jobs/s")
