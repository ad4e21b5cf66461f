"""The processes under test and beside them: the simulated downstream (its
stats and reset), the ingest and the relay, each started against
bench_product and waited for until ready; `simulator provider` runs (closed
or open loop, signed, with duplicates) and their summaries; and `Bench`, the
state the phases share."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from ports import free_port

from .common import PROCS, clean_env, http, peak_rss_mib, read_lines, wait_ready
from .config import (BIN, CFG, CONCURRENCIES, DUPLICATE_DELAY, DUPLICATE_RATE, LOGS, ORDERS, SECRET, BenchError,
                     log)
from .db import Db, Product, Reference


class Bench:
    """What the phases share: the databases, the processes running (the
    downstream, the ingest, the relays), the report's keys, the details,
    each phase's errors and wall time."""

    def __init__(self, db: Db) -> None:
        self.db, self.product, self.ref = db, Product(db), Reference(db)
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
        if not (peak or os.environ.get("BENCH_PEAK_RPS")):
            raise BenchError("no ingest peak measured")
        return float(peak or os.environ["BENCH_PEAK_RPS"])

    def e2e_peak_rps(self) -> float:
        """The deployed shape's peak (relay.end_to_end_peak): webhooks answered
        and delivered per second of the machine's cores."""
        if not self.report.get("e2e_peak_rps"):
            raise BenchError("no end-to-end peak measured (the relay phase measures it)")
        return self.report["e2e_peak_rps"]

    def record_rss(self) -> None:
        """Peak RSS (VmHWM) of the ingest and the relays, after the load phases."""
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
        p = PROCS.popen([BIN / "simulator", "downstream", "--listen", "127.0.0.1:0"], env=clean_env(),
                        stdout=subprocess.PIPE, stderr=open(LOGS / "downstream.log", "ab"))
        # Its only line on stdout: {"listening":"ADDR"}.
        line = read_lines(p, lambda _: True, timeout=30)[0][0]
        try:
            self.downstream, self.downstream_url = p, f"http://{json.loads(line)['listening']}"
        except (ValueError, KeyError):
            raise BenchError(f"simulator downstream: unexpected first line {line!r}")

    def stats(self, keys: bool = False, timeout: float = 60.0) -> dict:
        status, body = http(f"{self.downstream_url}/stats" + ("" if keys else "?keys=false"), timeout=timeout)
        if status != 200:
            raise BenchError(f"downstream /stats answered {status}")
        return json.loads(body)

    def reset_downstream(self) -> None:
        if http(f"{self.downstream_url}/control/reset", post=True)[0] >= 300:
            raise BenchError("downstream /control/reset failed")

    def start_ingest(self, tag: str, extra_env: dict | None = None) -> Service:
        port = free_port()
        env = {"WEBHOOK_SECRETS": SECRET, "INGEST_LISTEN_ADDR": f"127.0.0.1:{port}", **(extra_env or {})}
        return self.start_service("webhook-ingest", tag, env, f"http://127.0.0.1:{port}")

    def start_relay(self, tag: str, extra_env: dict | None = None) -> Service:
        env = {"FULFILMENT_URL": self.downstream_url, "EMAIL_URL": self.downstream_url, **(extra_env or {})}
        return self.start_service("outbox-relay", tag, env)

    def start_service(self, binary: str, tag: str, env: dict, url: str = "") -> Service:
        admin = free_port()
        env = clean_env({"DATABASE_URL": self.db.url(Product.DB), "ADMIN_LISTEN_ADDR": f"127.0.0.1:{admin}", **env})
        p = PROCS.popen([BIN / binary], env=env, stdout=open(LOGS / f"{binary.split('-')[-1]}-{tag}.log", "ab"),
                        stderr=subprocess.STDOUT)
        wait_ready(f"http://127.0.0.1:{admin}/readyz", p, f"{binary} ({tag})")
        return Service(p, url, tag)


class Service:
    def __init__(self, p: subprocess.Popen, url: str, tag: str) -> None:
        self.p, self.url, self.tag = p, url, tag
        self.rss = lambda: peak_rss_mib(p.pid)

    def stop(self) -> None:
        if (rc := PROCS.stop(self.p, grace=20)) not in (0, None):
            log(f"  note: {self.tag} exited {rc} on SIGTERM")


RUN_SEQ = [0]


def provider_args(target: str, tag: str, *extra) -> list:
    """`simulator provider` signing with the bench's secret, a run id of its
    own (so no run's idempotency keys meet another's), then `extra`."""
    RUN_SEQ[0] += 1
    return [BIN / "simulator", "provider", "--target", target, "--secret", SECRET, "--no-progress",
            "--run-id", f"b{int(time.time())}{RUN_SEQ[0]:02d}{tag}", "--allow-failures",
            # Bounded: an overloaded ingest (503 at its deadline) is retried for
            # at most this long per event, not the provider's default 120 s.
            "--give-up-after-ms", "15000", *extra]


def parse_summary(out: str, what: str) -> dict:
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise BenchError(f"{what}: no JSON summary on stdout")


def provider_run(ingest: Service, tag: str, during=None, *, concurrency: int | None = None, rate: float | None = None,
                 secs: float, orders: int = ORDERS) -> dict:
    """One provider run against `ingest` to completion (`rate`: open loop,
    events/s; else `concurrency` senders); its summary. With `during`, a
    function called once the provider has started: the run ends (SIGTERM,
    the provider then prints its summary) when it returns, if `secs` has
    not ended it before."""
    args = provider_args(ingest.url, tag, "--duration-secs", f"{secs:g}", "--duplicate-rate", DUPLICATE_RATE,
                         "--duplicate-delay-ms", DUPLICATE_DELAY, "--orders", orders, "--json",
                         *(["--rate", f"{rate:.1f}"] if rate is not None else ["--concurrency", concurrency]))
    with open(LOGS / f"provider-{tag}.log", "ab") as errf:
        p = PROCS.popen(args, env=clean_env(), stdout=subprocess.PIPE, stderr=errf)
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
    return parse_summary(out.decode(), f"provider {tag}")


def summary_brief(s: dict) -> dict:
    """What the report keeps of a provider's summary."""
    out = {"requests_per_s": round(s["deliveries_per_sec"], 1),
           "new_events_per_s": round(s.get("outcomes", {}).get("processed", 0) / s["elapsed_secs"], 1)
           if s.get("elapsed_secs") else None,
           **{f"{k}_ms": s.get("latency_ms", {}).get(k) for k in ("p50", "p90", "p99", "p999", "max")},
           **{k: s.get(k) for k in ("deliveries", "events", "elapsed_secs", "status_counts", "outcomes")}}
    bad = {k: v for k, v in (s.get("status_counts") or {}).items() if k != "200"}
    if bad or s.get("failed") or s.get("timeouts") or s.get("connection_errors"):
        out["problems"] = {"non_200": bad, **{k: s.get(k) for k in ("failed", "timeouts", "connection_errors")}}
    return out
