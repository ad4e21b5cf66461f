"""The `relay_log` phase (runner.PHASES): the relay's log line per call."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from .common import ratio
from .config import CFG, LOGS, log
from .db import Product, Session
from .relay import drain

if TYPE_CHECKING:
    from .runner import Bench


def run(bench: Bench) -> None:
    for relay in bench.relays:
        if relay.p.poll() is None:
            relay.stop()
    bench.product.reset(CFG["product_history"])
    rows = CFG["log_line_rows"]
    rates: dict = {"on": [], "off": []}
    cpu: dict = {"on": [], "off": []}
    lines: dict = {"on": [], "off": []}
    session = Session(bench.db, Product.DB)
    try:
        # On, off, off, on: a trend across the drains (dead tuples, a warm
        # cache) weighs on both sides alike. Drains 4..7: their own keys.
        for i, mode in enumerate(("on", "off", "off", "on")):
            tag = f"log-{mode}-{i}"
            (LOGS / f"relay-{tag}.log").unlink(missing_ok=True)  # its lines are counted below
            relay = bench.services.start_relay(tag, {"RUST_LOG": "warn"} if mode == "off" else None)
            try:
                d = drain(bench, session, [relay], 4 + i, f"log line {mode}", rows=rows)
            finally:
                relay.stop()
            rates[mode].append(d["rows_per_s"])
            cpu[mode].append(d["relay_cpu_secs"])
            text = (LOGS / f"relay-{tag}.log").read_text(errors="replace")
            lines[mode].append(text.count('"message":"downstream call finished"'))
    finally:
        session.close()
    on, off = statistics.mean(rates["on"]), statistics.mean(rates["off"])
    bench.details["relay_log"] = {"rows": rows, "rows_per_s": rates, "relay_cpu_secs": cpu, "call_lines": lines,
                                 "note": "one relay per drain; on = RUST_LOG unset (the default), "
                                         "off = RUST_LOG=warn; drains in the order on, off, off, on"}
    r = bench.report
    r["relay_rows_per_s_log_line_on"] = round(on, 1)
    r["relay_rows_per_s_log_line_off"] = round(off, 1)
    r["relay_log_line_drain_ratio"] = ratio(on, off)
    # The relay's own CPU per drain: less at the mercy of whatever else
    # the machine runs than the wall-clock rate.
    r["relay_log_line_cpu_ratio"] = ratio(statistics.mean(cpu["on"]), statistics.mean(cpu["off"]))
    r["relay_log_lines_per_drain"] = lines["on"]
    log(f"  relay log line: {on:,.0f} rows/s on vs {off:,.0f} off (RUST_LOG=warn): ratio "
        f"{r['relay_log_line_drain_ratio']}, relay cpu {cpu['on']} s on vs {cpu['off']} s off: ratio "
        f"{r['relay_log_line_cpu_ratio']}; call lines per drain on {lines['on']}, off {lines['off']}")
    if any(n < rows for n in lines["on"]) or any(lines["off"]):
        bench.errors["relay_log"] = (f"expected one call line per row with the line on ({rows}), none off: "
                                    f"on {lines['on']}, off {lines['off']}")
