"""Phase 5: graphile-worker draining as many no-op jobs, on bench_peer; then as
many jobs that each POST to the downstream (`--http`), like the relay's drain."""

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
    # Like for like with the relay's drain: each job POSTs to the same
    # zero-latency downstream, with an idempotency key and the relay's body.
    bench.services.reset_downstream()
    meter = CpuMeter()
    _, out, err = run_cmd("peer-http", ["node", "peer.js", "--jobs", jobs, "--concurrency", 24,
                                        "--http", bench.services.downstream_url], timeout=300,
                          cwd=OUT / "peer", env=clean_env({"DATABASE_URL": bench.db.url("bench_peer")}))
    (LOGS / "peer-http.log").write_text(out + err)
    http = parse_summary(out, "peer-http")
    http["machine_cores_busy"] = meter.cores_busy()
    http["downstream_effects"] = bench.services.stats()["effects"]
    bench.details["peer_http"] = http
    bench.report["peer_http_jobs_per_s"] = http["jobs_per_s"]
    bench.report["relay_vs_peer_http"] = ratio(bench.report.get("relay_rows_per_s_1"), http["jobs_per_s"])
    log(f"  peer, each job a POST to the downstream: {jobs:,} jobs in {http['seconds']}s = "
        f"{http['jobs_per_s']:,} jobs/s ({http['downstream_effects']:,} effects)")
