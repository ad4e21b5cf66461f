"""The phases in order, each announced as `[n/of] name ...` and
timed, its errors recorded (one failing phase does not stop the others),
and the state they share."""

from __future__ import annotations

import json
import os
import time
import traceback

from . import backlog, db_cpu, e2e, fresh, growth, ingest, outage, peer, prepare, prune, relay, relay_log, tracing
from .config import CONCURRENCIES, CFG, LOGS, ONLY, T0, BenchError, log
from .db import Db, Product, Reference
from .services import Service, Services


# Every phase in the order it runs, and what it measures: the one list
# (`python3 -m bench --list`; docs/BENCHMARK.md's table is written from it).
PHASES = [
    ("setup", prepare.run, "databases `bench_product` (migrated, 1M orders, some history), `bench_ref` "
     "(`bench/schema.sql`), `bench_peer` (empty); the downstream simulator; the peer's modules; the machine"),
    ("ingest", ingest.run, "closed loop at 1, 16 and 64 senders (signed, 10% duplicates), each beside pgbench "
     "running both reference ingests at the same concurrency and duration; at 64 senders three alternated pairs; "
     "every run starts from the same reset state"),
    ("half_load", ingest.run_half_load, "open loop at half of the measured peak: p50, p99"),
    ("relay", relay.run, "50,000 rows (quick: 30,000) inserted at once (one transaction with a `NOTIFY`) while "
     "the relay runs idle; three back-to-back drains with one relay (no VACUUM between them), one with two relays "
     "(after a VACUUM); then the ingest at 64 senders with a relay delivering, until nothing is pending: the "
     "end-to-end peak"),
    ("peer", peer.run, "graphile-worker (`bench/peer`, batching, concurrency 24) draining as many no-op jobs, "
     "then as many jobs that each POST to the downstream (`--http`)"),
    ("e2e", e2e.run, "webhook accepted to downstream effect: idle (20 events/s, one by one), while a provider "
     "load runs at half of the end-to-end peak, then at half of the ingest's own peak"),
    ("db_cpu", db_cpu.run, "Postgres CPU per webhook: the ingest at half of peak with a relay delivering, then "
     "pgbench at the same rate on each reference design (ingest and relay scripts 25:1), each until nothing is "
     "pending; two rounds (ours, naive, limit, then limit, naive, ours), added up"),
    ("tracing", tracing.run, "64 senders with and without OTLP export to a local sink"),
    ("relay_log", relay_log.run, "the relay's log line per call: drains with it on (the default level) and off "
     "(`RUST_LOG=warn`), alternated on, off, off, on"),
    ("prune", prune.run, "retention under load: 1M done outbox rows and 1M processed events 30 days old (quick: "
     "50k each); the ingest at half of peak for a baseline window, then while `outbox-relay prune` deletes them"),
    ("growth", growth.run, "64 senders and the relay's claim time with 1M and 10M processed events and 1M done "
     "outbox rows behind them (quick: smaller); a history the time budget cannot generate is cut, and said"),
    ("backlog", backlog.run, "the relay's backlog gauge statement (`backlog.sql`) with 3M pending rows (quick: "
     "300k): its median time"),
    ("fresh", fresh.run, "a new ingest's first 15 s at 64 senders on a just-migrated database, against the steady "
     "state on the same database; then a new relay over the backlog those payments left"),
    ("outage", outage.run, "a new relay over 500,000 rows due at once after a downstream outage, on six days of "
     "history (quick: less history); the peer over as many jobs (full runs)"),
]


def chosen(name: str) -> bool:
    """Whether this run runs the phase: every one, or setup and BENCH_PHASES."""
    return not ONLY or name == "setup" or name in ONLY


class Bench:
    """What the phases share: the databases, the services running, the
    report's keys, the details, each phase's errors and wall time."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.product = Product(db)
        self.ref = Reference(db)
        self.services = Services(db)
        self.report: dict = {"mode": CFG["mode"], "config": {k: v for k, v in CFG.items()}}
        self.details: dict = {}
        self.phases: dict = {}
        self.errors: dict = {}
        self.ingest: Service | None = None
        self.relays: list[Service] = []
        self.rss: dict = {}
        # `[n/of]` of each phase this run runs.
        names = [name for name, *_ in PHASES if chosen(name)]
        self.numbers = {name: f"[{i}/{len(names)}]" for i, name in enumerate(names, 1)}

    peer_error: str | None = None

    def phase(self, name: str, fn) -> None:
        """Runs `fn(self)` unless BENCH_PHASES leaves it out."""
        if not chosen(name):
            return
        t = time.monotonic()
        number = self.numbers[name]
        log(f"{number} {name} ...")
        try:
            fn(self)
        except BenchError as e:
            self.errors[name] = str(e)
            log(f"{number} {name} FAILED: {e}")
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError,
                ZeroDivisionError, json.JSONDecodeError) as e:
            # A bug or a surprise: the other phases still run, the trace goes to the logs.
            with open(LOGS / "bench-errors.log", "a") as f:
                f.write(f"--- phase {name}\n{traceback.format_exc()}\n")
            self.errors[name] = f"{type(e).__name__}: {e} (traceback in {LOGS / 'bench-errors.log'})"
            log(f"{number} {name} FAILED: {self.errors[name]}")
        self.phases[name] = round(time.monotonic() - t, 1)
        log(f"{number} {name} done ({self.phases[name]:.1f} s; {time.monotonic() - T0:.0f} s since the start)")

    def peak_rps(self) -> float:
        peaks = [self.report.get(f"ingest_rps_c{c}") or 0 for c in CONCURRENCIES]
        if not max(peaks) and os.environ.get("BENCH_PEAK_RPS"):
            return float(os.environ["BENCH_PEAK_RPS"])
        if not max(peaks):
            raise BenchError("no ingest peak measured")
        return max(peaks)

    def e2e_peak_rps(self) -> float:
        """The deployed shape's peak (relay.end_to_end_peak): webhooks answered
        and delivered per second of the machine's cores."""
        if self.report.get("e2e_peak_rps"):
            return float(self.report["e2e_peak_rps"])
        if os.environ.get("BENCH_E2E_PEAK_RPS"):
            return float(os.environ["BENCH_E2E_PEAK_RPS"])
        raise BenchError("no end-to-end peak measured (the relay phase measures it)")

    def record_rss(self) -> None:
        if self.ingest:
            self.rss["ingest"] = self.ingest.rss()
        for service in self.relays:
            if service.p.poll() is None:
                self.rss[f"relay_{service.tag}"] = service.rss()
        r = self.report
        r["ingest_rss_mib"] = (self.rss.get("ingest") or {}).get("peak_mib")
        peaks = [v.get("peak_mib") for k, v in self.rss.items() if k.startswith("relay") and v.get("peak_mib")]
        r["relay_rss_mib"] = max(peaks) if peaks else None
        self.details["rss"] = self.rss

    def run(self) -> None:
        for name, fn, _ in PHASES:
            self.phase(name, fn)
            if name == "setup" and "setup" in self.errors:
                return
            if name == "e2e":
                self.record_rss()  # after the load phases, whichever ran

    def drop_databases(self) -> None:
        """The growth history is gigabytes: the databases go unless BENCH_KEEP=1."""
        if os.environ.get("BENCH_KEEP", "") not in ("", "0"):
            log("BENCH_KEEP: keeping bench_product, bench_ref, bench_peer and bench_fresh")
            return
        for name in (Product.DB, Reference.DB, "bench_peer", fresh.FreshDb.DB):
            try:
                self.db.sql_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", timeout=120)
            except BenchError as e:
                log(f"  could not drop {name}: {e}")
