"""The processes under test and beside them (the downstream simulator, the ingest, the relays),
`simulator provider` runs, and `Bench`, the state the phases share."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from ports import free_port

from .common import BIN, CFG, CONCURRENCIES, DUPLICATE_DELAY, DUPLICATE_RATE, LOGS, ORDERS
from .common import SECRET, BenchError, clean_env, http, log, popen, read_lines, stop
from .common import wait_ready
from .db import PRODUCT, Db


class Service:
    def __init__(self, p: subprocess.Popen, url: str, tag: str) -> None:
        self.p, self.url, self.tag = p, url, tag

    def rss(self) -> float | None:
        """Peak resident memory (VmHWM) in MiB, while it runs."""
        try:
            status = Path(f"/proc/{self.p.pid}/status").read_text()
        except OSError:
            return None
        m = re.search(r"^VmHWM:\s+(\d+)", status, re.M)
        return round(int(m.group(1)) / 1024, 1) if m else None

    def stop(self) -> None:
        if (rc := stop(self.p, grace=20)) not in (0, None):
            log(f"  note: {self.tag} exited {rc} on SIGTERM")


class Bench:
    """The databases, the processes running, the report's keys and details, each phase's
    errors and wall time."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.report: dict = {"mode": CFG["mode"], "config": dict(CFG)}
        self.details, self.phases, self.errors, self.rss = {}, {}, {}, {}
        self.ingest: Service | None = None
        self.relays: list[Service] = []
        self.downstream: subprocess.Popen | None = None
        self.downstream_url = ""
        self.peer_error: str | None = None

    def peak_rps(self) -> float:
        """The ingest's closed-loop peak, or BENCH_PEAK_RPS without the ingest phase."""
        peak = max(self.report.get(f"ingest_rps_c{c}") or 0 for c in CONCURRENCIES)
        if not (peak := peak or float(os.environ.get("BENCH_PEAK_RPS", 0))):
            raise BenchError("no ingest peak measured")
        return peak

    def record_rss(self) -> None:
        """Peak RSS of the ingest and the relays, after the load phases."""
        if self.ingest:
            self.rss["ingest"] = self.ingest.rss()
        self.rss.update({f"relay_{s.tag}": s.rss() for s in self.relays if s.p.poll() is None})
        peaks = [v for k, v in self.rss.items() if k.startswith("relay") and v]
        self.report["ingest_rss_mib"] = self.rss.get("ingest")
        self.report["relay_rss_mib"] = max(peaks) if peaks else None

    def stop_relays(self) -> None:
        """Another phase's relay would drain or prune this phase's rows too."""
        for relay in self.relays:
            if relay.p.poll() is None:
                relay.stop()

    def start_downstream(self) -> None:
        p = popen([BIN / "simulator", "downstream", "--listen", "127.0.0.1:0"],
                        env=clean_env(), stdout=subprocess.PIPE,
                        stderr=open(LOGS / "downstream.log", "ab"))
        line = read_lines(p, lambda _: True, timeout=30)[0][0]  # {"listening":"ADDR"}
        self.downstream, self.downstream_url = p, f"http://{json.loads(line)['listening']}"

    def stats(self, keys: bool = False, timeout: float = 60.0) -> dict:
        url = f"{self.downstream_url}/stats" + ("" if keys else "?keys=false")
        status, body = http(url, timeout=timeout)
        if status != 200:
            raise BenchError(f"downstream /stats answered {status}")
        return json.loads(body)

    def reset_downstream(self) -> None:
        if http(f"{self.downstream_url}/control/reset", post=True)[0] >= 300:
            raise BenchError("downstream /control/reset failed")

    def reset(self) -> None:
        """bench_product's reset state and a downstream that saw nothing yet."""
        self.db.reset_product(CFG["product_history"])
        self.reset_downstream()

    def start_ingest(self, tag: str, env: dict | None = None) -> Service:
        port = free_port()
        env = {"WEBHOOK_SECRETS": SECRET, "INGEST_LISTEN_ADDR": f"127.0.0.1:{port}", **(env or {})}
        return self.start_service("webhook-ingest", tag, env, f"http://127.0.0.1:{port}")

    def start_relay(self, tag: str, env: dict | None = None) -> Service:
        urls = {"FULFILMENT_URL": self.downstream_url, "EMAIL_URL": self.downstream_url}
        return self.start_service("outbox-relay", tag, {**urls, **(env or {})})

    def start_service(self, binary: str, tag: str, env: dict, url: str = "") -> Service:
        admin = free_port()
        env = clean_env({"DATABASE_URL": self.db.url(PRODUCT),
                         "ADMIN_LISTEN_ADDR": f"127.0.0.1:{admin}", **env})
        logf = open(LOGS / f"{binary.split('-')[-1]}-{tag}.log", "ab")
        p = popen([BIN / binary], env=env, stdout=logf, stderr=subprocess.STDOUT)
        wait_ready(f"http://127.0.0.1:{admin}/readyz", p, f"{binary} ({tag})")
        return Service(p, url, tag)

    def run_new_ingest(self, tag: str, secs: float, database: str = PRODUCT) -> dict:
        """A new ingest on `database`, 64 senders for `secs`, stopped after."""
        ingest = self.start_ingest(tag, {"DATABASE_URL": self.db.url(database)})
        try:
            s = provider_run(ingest, tag, concurrency=64, secs=secs)
        finally:
            ingest.stop()
        log(f"  c64 {tag}: {s['requests_per_s']:,.0f} req/s, p99 {s['p99_ms']} ms")
        return s


RUN_SEQ = [0]


def provider_args(target: str, tag: str, *extra) -> list:
    """`simulator provider` with the bench's secret and a run id of its own (so no run's
    idempotency keys meet another's)."""
    RUN_SEQ[0] += 1
    return [BIN / "simulator", "provider", "--target", target, "--secret", SECRET,
            "--no-progress", "--run-id", f"b{int(time.time())}{RUN_SEQ[0]:02d}{tag}",
            # Bounded: an overloaded ingest (503 at its deadline) is retried for at most
            # this long per event, not the provider's default 120 s.
            "--allow-failures", "--give-up-after-ms", "15000", *extra]


def parse_summary(out: str, what: str) -> dict:
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise BenchError(f"{what}: no JSON summary on stdout")


def provider_run(ingest: Service, tag: str, during=None, *, concurrency: int | None = None,
                 rps: float | None = None, secs: float, orders: int = ORDERS) -> dict:
    """One provider run against `ingest`, open loop at `rps` deliveries/s (10% of its events
    are delivered twice), else `concurrency` senders: its summary. With `during`, a function
    called once it started: the run ends when it returns, if `secs` has not ended it."""
    load = ["--concurrency", concurrency] if rps is None else [
        "--rate", f"{rps / (1 + DUPLICATE_RATE):.1f}"]
    args = provider_args(ingest.url, tag, "--duration-secs", f"{secs:g}", "--duplicate-rate",
                         DUPLICATE_RATE, "--duplicate-delay-ms", DUPLICATE_DELAY, "--orders",
                         orders, "--json", *load)
    with open(LOGS / f"provider-{tag}.log", "ab") as errf:
        p = popen(args, env=clean_env(), stdout=subprocess.PIPE, stderr=errf)
        try:
            if during is not None:
                during()
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)  # it then prints its summary
            out, _ = p.communicate(timeout=secs + 120)
        except subprocess.TimeoutExpired:
            raise BenchError(f"provider {tag} did not finish within {secs + 120:.0f}s")
        finally:
            stop(p)
    s = parse_summary(out.decode(), f"provider {tag}")
    elapsed, processed = s["elapsed_secs"], s["outcomes"].get("processed", 0)
    s.update({f"{k}_ms": s["latency_ms"][k] for k in ("p50", "p99", "p999", "max")},
             requests_per_s=round(s["deliveries_per_sec"], 1),
             new_events_per_s=round(processed / elapsed, 1) if elapsed else None)
    return s
