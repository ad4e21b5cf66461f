"""The `e2e` phase (runner.PHASES): webhook accepted -> downstream effect."""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING

from .common import clean_env, pct, run_cmd
from .config import (BIN, CFG, DUPLICATE_RATE, E2E_IDLE_ORDER0, E2E_LOAD_ORDER0, E2E_RATE, LOGS, SECRET,
                     BenchError, log)
from .load import provider_run, run_id, summary_brief
from .services import Services

if TYPE_CHECKING:
    from .runner import Bench


def send_paced(target: str, tag: str, order0: int, count: int, rate: float,
               secs: float | None = None) -> list[tuple[int, float]]:
    """`simulator provider` sends `count` payments at `rate`/s (open loop, no
    duplicates) to orders order0+1.. , for at most `secs`; returns (order,
    accepted unix ms) of those answered 2xx `processed`, from its ack file."""
    acks = LOGS / f"acks-{tag}.jsonl"
    acks.unlink(missing_ok=True)
    args = [BIN / "simulator", "provider", "--target", target, "--secret", SECRET,
            "--rate", f"{rate:g}", "--events", str(count), "--first-order", str(order0 + 1),
            "--orders", str(count), "--run-id", run_id(tag), "--ack-file", acks,
            "--no-progress", "--allow-failures", "--give-up-after-ms", "15000"]
    if secs is not None:
        args += ["--duration-secs", f"{secs:g}"]
    limit = (secs if secs is not None else count / rate) + 60
    _, _, err = run_cmd(f"provider {tag}", args, timeout=limit, env=clean_env(), check=False)
    (LOGS / f"provider-{tag}.log").write_text(err)
    sent: list[tuple[int, float]] = []
    for line in acks.read_text().splitlines() if acks.exists() else []:
        ack = json.loads(line)
        order = int(ack["payment_id"].removeprefix("pay_"))
        if ack["status"] == "processed" and ack.get("acknowledged_at_ms") is not None:
            sent.append((order, float(ack["acknowledged_at_ms"])))
        else:
            log(f"  e2e: event for order {order} answered {ack['http_status']} {ack['status']}")
    if not sent:
        raise BenchError(f"provider {tag}: no event acknowledged as processed; see {LOGS / f'provider-{tag}.log'}")
    return sent


def e2e_latencies(services: Services, sent: list[tuple[int, float]], timeout: float) -> dict:
    """Waits until every sent event's shipment happened downstream, then
    latency = the key's effect time (simulator clock) - the 200's receipt."""
    deadline = time.monotonic() + timeout
    want = {f"ship-{order}": ms for order, ms in sent}
    keys: dict = {}
    while True:
        st = services.stats(keys=True, timeout=120)
        keys = st.get("keys") or {}
        missing = [k for k in want if (keys.get(k) or {}).get("effect_at_ms") is None]
        if not missing:
            break
        if time.monotonic() > deadline:
            log(f"  e2e: {len(missing)} of {len(want)} shipments never happened within {timeout:.0f}s")
            break
        time.sleep(0.5)
    lat = [keys[k]["effect_at_ms"] - ms for k, ms in want.items()
           if (keys.get(k) or {}).get("effect_at_ms") is not None]
    return {"events": len(want), "delivered": len(lat), "p50_ms": pct(lat, 50), "p90_ms": pct(lat, 90),
            "p99_ms": pct(lat, 99), "max_ms": round(max(lat), 1) if lat else None,
            "min_ms": round(min(lat), 1) if lat else None}


def run(bench: Bench) -> None:
    if not bench.ingest or not bench.relays:
        raise BenchError("needs the ingest and a relay running")
    bench.product.reset(CFG["product_history"])
    bench.services.reset_downstream()
    n = CFG["e2e_idle_events"]
    sent = send_paced(bench.ingest.url, "idle", E2E_IDLE_ORDER0, n, E2E_RATE)
    idle = e2e_latencies(bench.services, sent, timeout=60)
    log(f"  e2e idle ({n} events at {E2E_RATE:g}/s): p50 {idle['p50_ms']} p99 {idle['p99_ms']} "
        f"max {idle['max_ms']} ms")
    # Under load: a provider at half of the deployed shape's peak (the
    # ingest and a relay together, relay.end_to_end_peak), our events in the
    # middle of it; then the same at half of the ingest's own peak, which is
    # more than a relay can follow on the same cores (docs/BENCHMARK.md).
    e2e_peak, ingest_peak = bench.e2e_peak_rps(), bench.peak_rps()
    loaded, s, st = under_load(bench, e2e_peak / 2, "load")
    ingest_half, s_ingest_half, _ = under_load(bench, ingest_peak / 2, "load-ingest-peak")
    bench.details["e2e"] = {"idle": idle, "load": loaded, "load_provider": s,
                           "load_downstream_effects": st["effects"], "double_effects": st["double_effects"],
                           "basis": "half of e2e_peak_rps (the ingest and a relay together)",
                           "at_half_ingest_peak": {"load": ingest_half, "load_provider": s_ingest_half}}
    r = bench.report
    r["e2e_p50_ms_idle"], r["e2e_p99_ms_idle"] = idle["p50_ms"], idle["p99_ms"]
    r["e2e_p50_ms_load"], r["e2e_p99_ms_load"] = loaded["p50_ms"], loaded["p99_ms"]
    r["ingest_p99_ms_half_load_with_relay"] = s.get("p99_ms")
    r["e2e_load_rps"] = s.get("requests_per_s")
    r["e2e_p99_ms_half_ingest_peak"] = ingest_half["p99_ms"]
    r["ingest_p99_ms_half_ingest_peak_with_relay"] = s_ingest_half.get("p99_ms")
    r["e2e_half_ingest_peak_rps"] = s_ingest_half.get("requests_per_s")


def under_load(bench: Bench, rps: float, tag: str) -> tuple[dict, dict, dict]:
    """A provider load of `rps` deliveries/s (10% duplicates) for the e2e
    window with our paced events in its middle: their latencies, the load's
    summary, the downstream's stats."""
    bench.product.reset(CFG["product_history"])
    bench.services.reset_downstream()
    rate = rps / (1 + DUPLICATE_RATE)
    secs = CFG["e2e_load_secs"]
    box: dict = {}

    def load() -> None:
        try:
            box["s"] = provider_run(bench.ingest.url, f"e2e-{tag}", bench.ingest, rate=rate, secs=secs,
                                    orders=900_000)
        except BenchError as e:
            box["error"] = str(e)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    time.sleep(1.0)
    sent = send_paced(bench.ingest.url, tag, E2E_LOAD_ORDER0, int(secs * E2E_RATE), E2E_RATE,
                      secs=secs - 1.5)
    t.join(timeout=secs + 150)
    if "error" in box:
        raise BenchError(box["error"])
    loaded = e2e_latencies(bench.services, sent, timeout=120)
    st = bench.services.stats()
    s = summary_brief(box["s"]) if "s" in box else {}
    log(f"  e2e under load ({s.get('requests_per_s', 0):,.0f} req/s, {tag}, relay draining): p50 "
        f"{loaded['p50_ms']} p99 {loaded['p99_ms']} max {loaded['max_ms']} ms; ingest p99 {s.get('p99_ms')} ms")
    return loaded, s, st
