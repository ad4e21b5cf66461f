"""Load: `simulator provider` runs (closed or open loop, signed, with
duplicates), their JSON summaries, and the brief the report keeps."""

from __future__ import annotations

import json
import signal
import subprocess
import time

from .common import PROCS, CpuMeter, clean_env
from .config import BIN, DUPLICATE_DELAY, DUPLICATE_RATE, LOGS, ORDERS, SECRET, BenchError
from .services import Service


RUN_SEQ = [0]


def run_id(tag: str) -> str:
    RUN_SEQ[0] += 1
    return f"b{int(time.time())}{RUN_SEQ[0]:02d}{tag}"


def provider_args(target: str, tag: str, *, concurrency: int | None = None, rate: float | None = None,
                  secs: float, orders: int = ORDERS) -> list:
    args = [BIN / "simulator", "provider", "--target", target, "--secret", SECRET,
            "--duration-secs", f"{secs:g}", "--duplicate-rate", str(DUPLICATE_RATE),
            "--duplicate-delay-ms", DUPLICATE_DELAY, "--orders", str(orders), "--json", "--no-progress",
            "--run-id", run_id(tag), "--allow-failures",
            # Bounded: an overloaded ingest (503 at its deadline) is retried for
            # at most this long per event, not the provider's default 120 s.
            "--give-up-after-ms", "15000"]
    if rate is not None:
        args += ["--rate", f"{rate:.1f}"]
    else:
        args += ["--concurrency", str(concurrency)]
    return args


def parse_summary(out: str, what: str) -> dict:
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise BenchError(f"{what}: no JSON summary on stdout")


def provider_run(target: str, tag: str, ingest: Service | None = None, during=None, **kw) -> dict:
    """One provider run to completion; its summary plus the ingest's CPU and
    the machine's CPU use during the run. With `during`, a function called once
    the provider has started: the run ends (SIGTERM, the provider then prints
    its summary) when it returns, if `secs` has not ended it before."""
    secs = kw["secs"]
    cpu0 = ingest.cpu() if ingest else None
    meter = CpuMeter()
    with open(LOGS / f"provider-{tag}.log", "ab") as errf:
        p = PROCS.popen(f"provider {tag}", provider_args(target, tag, **kw), env=clean_env(),
                        stdout=subprocess.PIPE, stderr=errf)
        try:
            if during is not None:
                during()
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            out, _ = p.communicate(timeout=secs + 120)
        except subprocess.TimeoutExpired:
            raise BenchError(f"provider {tag} did not finish within {secs + 120:.0f}s")
        finally:
            PROCS.stop(p)
    s = parse_summary(out.decode(), f"provider {tag}")
    s["machine_cores_busy"] = meter.cores_busy()
    if ingest and cpu0 is not None:
        cpu1 = ingest.cpu()
        if cpu1 is not None:
            s["ingest_cpu_secs"] = round(cpu1 - cpu0, 2)
    bad = {k: v for k, v in s.get("status_counts", {}).items() if k != "200"}
    if bad or s.get("failed") or s.get("timeouts") or s.get("connection_errors"):
        s["problems"] = {"non_200": bad, "failed": s.get("failed"), "timeouts": s.get("timeouts"),
                         "connection_errors": s.get("connection_errors")}
    return s


def summary_brief(s: dict) -> dict:
    lat = s.get("latency_ms", {})
    out = {
        "requests_per_s": round(s["deliveries_per_sec"], 1),
        "new_events_per_s": round(s.get("outcomes", {}).get("processed", 0) / s["elapsed_secs"], 1)
        if s.get("elapsed_secs") else None,
        "p50_ms": lat.get("p50"), "p90_ms": lat.get("p90"), "p99_ms": lat.get("p99"),
        "p999_ms": lat.get("p999"), "max_ms": lat.get("max"),
        "deliveries": s.get("deliveries"), "events": s.get("events"), "replayed": s.get("replayed"),
        "elapsed_secs": s.get("elapsed_secs"), "status_counts": s.get("status_counts"),
        "outcomes": s.get("outcomes"), "provider_cpu_secs": s.get("cpu_secs"),
        "ingest_cpu_secs": s.get("ingest_cpu_secs"), "machine_cores_busy": s.get("machine_cores_busy"),
    }
    if s.get("problems"):
        out["problems"] = s["problems"]
    return out
