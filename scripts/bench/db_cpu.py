"""CPU by process (`Split`) and the `db_cpu` phase (docs/BENCHMARK.md, "How the figures are
measured")."""

from __future__ import annotations

import math
import os
import re
import resource
import time
from collections import Counter
from pathlib import Path

from .common import CFG, REFS, BenchError, log, proc_cpu_secs, ratio, read_stat
from .db import PRODUCT, REFERENCE, Session
from .services import Bench, Service, provider_run

TICK = os.sysconf("SC_CLK_TCK")
REF_CLIENTS = 16  # pgbench's clients for the naive design (the ingest's default pool is 16)
# 25 ingest transactions (2 outbox rows each) per relay transaction (a batch of 50).
INGEST_WEIGHT, RELAY_WEIGHT = 25, 1


def children_cpu_secs() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Split:
    """CPU by process between start() and stop(): the Postgres server's (the postmaster, found
    as a backend's parent and checked against postmaster.pid, and its children: what each
    gained, and what the exited ones did), by process kind, not counting other databases'
    backends and the bench's sessions (this one's and `exclude`); beside it, `pids` (name ->
    pid) and with `children` (a label) what the bench's children that exited used."""

    def __init__(self, bench: Bench, database: str, pids: dict | None = None,
                 children: str | None = None, exclude: set[int] | None = None) -> None:
        self.bench, self.database, self.pids, self.children = bench, database, pids or {}, children
        self.exclude = set(exclude or ())

    def start(self) -> Split:
        self.session = Session(self.bench.db, self.database)
        backend = self.session.backend_pid()
        if (stat := read_stat(backend)) is None:
            raise BenchError(f"no /proc/{backend}: Postgres is not on this machine")
        self.postmaster = int(stat[1])
        self.exclude.add(backend)
        try:  # the setting and the file need privileges the bench's role may lack
            data = self.session.query("SHOW data_directory;")[0].strip()
            listed = int(Path(data, "postmaster.pid").read_text().split("\n", 1)[0])
        except (BenchError, OSError, ValueError, IndexError):
            listed = self.postmaster
        if listed != self.postmaster:
            raise BenchError(f"backend {backend}'s parent is not the postmaster ({listed})")
        self.proc0 = {name: proc_cpu_secs(pid) for name, pid in self.pids.items()}
        self.children0, self.pg0, self.t0 = children_cpu_secs(), self.read(), time.monotonic()
        return self

    def read(self) -> tuple[int, int, dict]:
        """(the postmaster's own ticks, its exited children's, {(pid, start): ticks})."""
        live = {}
        for entry in os.scandir("/proc"):
            f = read_stat(entry.name) if entry.name.isdigit() else None
            if f is not None and int(f[1]) == self.postmaster:
                live[(int(entry.name), int(f[19]))] = int(f[11]) + int(f[12])
        if (pm := read_stat(self.postmaster)) is None:
            raise BenchError(f"the postmaster ({self.postmaster}) is gone")
        return int(pm[11]) + int(pm[12]), int(pm[13]) + int(pm[14]), live

    def stop(self) -> dict:
        try:
            (pm0, exited0, live0), (pm1, exited1, live1) = self.pg0, self.read()
            secs = time.monotonic() - self.t0
            kinds = {int(pid): rest for pid, *rest in (row.split("|") for row in self.session.query(
                "SELECT pid, backend_type, coalesce(datname, ''), application_name "
                "FROM pg_stat_activity;"))}
            cpu = {name: round(proc_cpu_secs(pid) - self.proc0[name], 3)
                   for name, pid in self.pids.items()}
            if self.children:
                cpu[self.children] = round(children_cpu_secs() - self.children0, 3)
        finally:
            self.session.close()
        used, excluded = Counter(), Counter()  # label -> ticks
        for key, ticks in live1.items():
            gained = ticks - live0.get(key, 0)
            kind, database, app = kinds.get(key[0], ("other", "", ""))
            if key[0] in self.exclude:
                excluded["the bench's polling session"] += gained
            elif kind == "client backend" and database != self.database:
                excluded[f"backends of {database}"] += gained
            elif kind == "client backend":
                used[f"backend: {app or database}"] += gained
            else:
                used[f"background: {kind}"] += gained
        used["exited"] += exited1 - exited0 - sum(t for k, t in live0.items() if k not in live1)
        used["postmaster"] += pm1 - pm0
        pg = {"seconds": round(secs, 2), "cpu_secs": round(sum(used.values()) / TICK, 2),
              "split_secs": {k: round(v / TICK, 2) for k, v in used.most_common()},
              "excluded_secs": {k: round(v / TICK, 2) for k, v in excluded.items()}}
        return {"cpu_secs": {"postgres": pg["cpu_secs"], **cpu}, "postgres": pg}


def per_unit(split: dict, n: int | float) -> dict:
    """Microseconds of CPU per unit of work, by part and in total."""
    parts = {k: round(v / n * 1e6, 1) for k, v in split["cpu_secs"].items()} if n else {}
    return {**parts, "total": round(sum(parts.values()), 1) if parts else None}


def brief(u: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in u.items())


def measured(bench: Bench, database: str, work) -> dict:
    """`work(session)`'s result and, as `window`, the Postgres CPU over it."""
    time.sleep(1.0)  # the reset's sessions gone, the services idle again
    split = Split(bench, database).start()
    try:
        out = work(split.session)
    finally:
        out["window"] = split.stop()["postgres"]
    return out


def product_run(bench: Bench, ingest: Service, rps: float, secs: float) -> dict:
    bench.reset()

    def work(session: Session) -> dict:
        s = provider_run(ingest, "db-cpu", rps=rps, secs=secs)
        session.wait_drained(120, "db_cpu product", every=0.1)
        answered = sum(n for code, n in s["status_counts"].items() if code.startswith("2"))
        if not answered or not s["acknowledged"]:
            raise BenchError(f"db_cpu: the provider got no 2xx answer: {s['status_counts']}")
        return {"load": s, "units": answered, "new_events": s["acknowledged"]}

    return measured(bench, PRODUCT, work)


def naive_run(bench: Bench, rate: float, secs: float) -> dict:
    bench.db.reset_reference()
    total_rate = rate * (INGEST_WEIGHT + RELAY_WEIGHT) / INGEST_WEIGHT
    ingest_file, relay_file = REFS / "reference-ingest.sql", REFS / "reference-relay.sql"

    def work(session: Session) -> dict:
        out = bench.db.pgbench("db-cpu-naive", [
            "-c", REF_CLIENTS, "-j", 2, "-T", max(1, round(secs)), "-R", f"{total_rate:.1f}",
            "-f", f"{ingest_file}@{INGEST_WEIGHT}", "-f", f"{relay_file}@{RELAY_WEIGHT}"],
            secs + 120)
        # The ingest script's: "SQL script 1: ...\n - weight: ...\n - N transactions (..."
        m = re.search(r"SQL script 1: [^\n]*\n - weight: [^\n]*\n - (\d+) transactions", out)
        if not m:
            raise BenchError(f"pgbench db-cpu naive: no per-script transactions: {out[-500:]}")
        # Scripts are drawn at random: when the relay's share fell behind, it drains the
        # rest on its own, inside the window.
        for attempt in range(20):
            if (pending := session.pending()) == 0:
                return {"units": int(m.group(1)), "rate_requested_tps": round(total_rate, 1)}
            if attempt >= 1:  # a claim whose completion never ran holds its rows for 60 s
                session.query("UPDATE outbox SET locked_until = NULL WHERE status = 'pending' "
                              "AND locked_until > now();")
            bench.db.pgbench("db-cpu-naive-drain",
                             ["-c", 1, "-t", math.ceil(pending / 50), "-f", relay_file], 120)
        raise BenchError("pgbench db-cpu naive: the outbox would not drain")

    return measured(bench, REFERENCE, work)


def run(bench: Bench) -> None:
    rate, ingest, own, rounds = bench.peak_rps() / 2, bench.ingest, [], []
    try:
        if ingest is None:
            own.append(ingest := bench.start_ingest("db-cpu"))
        if not any(r.p.poll() is None for r in bench.relays):
            own.append(bench.start_relay("db-cpu"))
        # Two rounds of half the window each, ours, naive, then naive, ours: a drift of the
        # machine weighs on each alike. The naive design runs at the rate ours answered.
        secs = CFG["db_cpu_secs"] / 2
        for name in ("product", "naive", "naive", "product"):
            rounds.append(product_run(bench, ingest, rate, secs) if name == "product" else
                          naive_run(bench, rounds[0]["load"]["requests_per_s"], secs))
    finally:
        for service in own:
            service.stop()

    def us(runs: list[dict], key: str = "units") -> float:
        """Postgres CPU per unit of the runs, in microseconds."""
        cpu = sum(x["window"]["cpu_secs"] for x in runs)
        return round(cpu / sum(x[key] for x in runs) * 1e6, 1)

    ours, naive = [rounds[0], rounds[3]], [rounds[1], rounds[2]]
    per_round = [ratio(us([p]), us([n])) for p, n in zip(ours, naive)]
    r = bench.report
    r.update(db_cpu_rps=rounds[0]["load"]["requests_per_s"], db_cpu_us_per_webhook=us(ours),
             db_cpu_us_per_new_event=us(ours, "new_events"), db_cpu_us_per_webhook_naive=us(naive),
             db_cpu_vs_naive=ratio(us(ours), us(naive)))
    bench.details["db_cpu"] = {"rate_target_rps": round(rate, 1), "rounds": rounds,
                               "ratio_per_round": per_round}
    log(f"  db cpu at {r['db_cpu_rps']:,.0f} req/s: ours {r['db_cpu_us_per_webhook']} us per "
        f"webhook, naive {r['db_cpu_us_per_webhook_naive']}: {r['db_cpu_vs_naive']} {per_round}")
