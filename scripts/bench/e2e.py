"""The `e2e` phase: webhook accepted -> downstream effect, idle and under load."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

from .common import CFG, E2E_IDLE_ORDER0, E2E_LOAD_ORDER0, E2E_RATE, LOGS, BenchError
from .common import clean_env, log, pct, run_cmd
from .services import Bench, provider_args, provider_run


def send_paced(bench: Bench, tag: str, order0: int, count: int, secs: float | None = None):
    """`count` payments at E2E_RATE/s (no duplicates) to orders order0 + 1.., for at most
    `secs`; the shipment's key -> accepted unix ms of those answered `processed`."""
    acks = LOGS / f"acks-{tag}.jsonl"
    acks.unlink(missing_ok=True)
    args = provider_args(bench.ingest.url, tag, "--rate", f"{E2E_RATE:g}", "--events", count,
                         "--first-order", order0 + 1, "--orders", count, "--ack-file", acks)
    if secs is not None:
        args += ["--duration-secs", f"{secs:g}"]
    timeout = (secs or count / E2E_RATE) + 60
    _, _, err = run_cmd(f"provider {tag}", args, timeout, clean_env(), check=False)
    (LOGS / f"provider-{tag}.log").write_text(err)
    acked = [json.loads(line) for line in (acks.read_text().splitlines() if acks.exists() else [])]
    sent = {f"ship-{a['payment_id'].removeprefix('pay_')}": float(a["acknowledged_at_ms"])
            for a in acked
            if a["status"] == "processed" and a.get("acknowledged_at_ms") is not None}
    if len(sent) < len(acked):
        log(f"  e2e: {len(acked) - len(sent)} of {len(acked)} events not acknowledged processed")
    if not sent:
        raise BenchError(f"provider {tag}: no event acknowledged as processed; see the logs")
    return sent


def latencies(bench: Bench, want: dict[str, float], timeout: float) -> dict:
    """Waits until every sent event's shipment happened downstream; latency = the key's
    effect time (simulator clock) - the 200's receipt."""
    deadline = time.monotonic() + timeout
    while True:
        keys = bench.stats(keys=True, timeout=120).get("keys") or {}
        missing = [k for k in want if (keys.get(k) or {}).get("effect_at_ms") is None]
        if not missing:
            break
        if time.monotonic() > deadline:
            log(f"  e2e: {len(missing)} of {len(want)} shipments never happened in {timeout:.0f}s")
            break
        time.sleep(0.5)
    lat = [keys[k]["effect_at_ms"] - ms for k, ms in want.items() if k not in missing]
    return {"events": len(want), "delivered": len(lat), "p50_ms": pct(lat, 50),
            "p99_ms": pct(lat, 99), "max_ms": round(max(lat), 1) if lat else None}


def run(bench: Bench) -> None:
    if not bench.ingest or not bench.relays:
        raise BenchError("needs the ingest and a relay running")
    bench.reset()
    n = CFG["e2e_idle_events"]
    idle = latencies(bench, send_paced(bench, "idle", E2E_IDLE_ORDER0, n), timeout=60)
    log(f"  e2e idle ({n} events at {E2E_RATE:g}/s): p50 {idle['p50_ms']} p99 {idle['p99_ms']} ms")
    # Under load at half of the deployed shape's peak (the ingest and a relay together), our
    # events in the middle of it; then at half of the ingest's own peak, which is more than a
    # relay can follow on the same cores (docs/BENCHMARK.md).
    if not (e2e_peak := bench.report.get("e2e_peak_rps")):
        raise BenchError("no end-to-end peak measured (the relay phase measures it)")
    loaded, s = under_load(bench, e2e_peak / 2, "load")
    half, s_half = under_load(bench, bench.peak_rps() / 2, "load-ingest-peak")
    bench.details["e2e"] = {"idle": idle, "load": loaded, "load_provider": s,
                            "at_half_ingest_peak": {"load": half, "load_provider": s_half}}
    bench.report.update(
        e2e_p50_ms_idle=idle["p50_ms"], e2e_p99_ms_idle=idle["p99_ms"],
        e2e_p50_ms_load=loaded["p50_ms"], e2e_p99_ms_load=loaded["p99_ms"],
        ingest_p99_ms_half_load_with_relay=s["p99_ms"], e2e_load_rps=s["requests_per_s"],
        e2e_p99_ms_half_ingest_peak=half["p99_ms"],
        ingest_p99_ms_half_ingest_peak_with_relay=s_half["p99_ms"],
        e2e_half_ingest_peak_rps=s_half["requests_per_s"])


def under_load(bench: Bench, rps: float, tag: str) -> tuple[dict, dict]:
    """A provider load of `rps` deliveries/s for the e2e window with our paced events in its
    middle: their latencies and the load's summary."""
    bench.reset()
    secs = CFG["e2e_load_secs"]
    with ThreadPoolExecutor(1) as pool:
        load = pool.submit(provider_run, bench.ingest, f"e2e-{tag}", rps=rps, secs=secs,
                           orders=900_000)
        time.sleep(1.0)
        sent = send_paced(bench, tag, E2E_LOAD_ORDER0, int(secs * E2E_RATE), secs=secs - 1.5)
        s = load.result(timeout=secs + 150)
    loaded = latencies(bench, sent, timeout=120)
    log(f"  e2e under load ({s['requests_per_s']:,.0f} req/s, {tag}, relay draining): p50 "
        f"{loaded['p50_ms']} p99 {loaded['p99_ms']} max {loaded['max_ms']} ms; ingest p99 "
        f"{s['p99_ms']} ms")
    return loaded, s
