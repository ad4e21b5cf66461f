"""CPU by process (`Split`), and the `db_cpu` phase (runner.PHASES; the method:
docs/BENCHMARK.md, "How the figures are measured"). Postgres CPU of every
process of the server, as bench/README.md counts it, read from /proc: the
postmaster (postmaster.pid, or the parent of a backend) and its children,
each child's utime + stime gained in the window, the postmaster's own and
its cutime + cstime for the children that exited. The bench's polling
session, other databases' backends and the services' own CPU are reported
beside, never counted. Per unit of work (`per_unit`), with the other
processes' CPU, for the throughput ratios two shared cores decide
(docs/BENCHMARK.md, "What bounds the ratios")."""

from __future__ import annotations

import math
import os
import re
import resource
import time
from collections import Counter
from pathlib import Path

from .common import proc_cpu_secs, ratio, read_stat, run_cmd
from .config import CFG, DUPLICATE_RATE, LOGS, REFS, BenchError, log
from .db import Product, Reference, Session
from .services import Bench, Service, provider_run, summary_brief

TICK = os.sysconf("SC_CLK_TCK")
# pgbench's clients for the naive reference (the ingest's default pool is 16).
REF_CLIENTS = 16
# 25 ingest transactions (2 outbox rows each) per relay transaction (a batch of 50).
INGEST_WEIGHT, RELAY_WEIGHT = 25, 1


class Split:
    """CPU by process between start() and stop(): Postgres's, split by process
    kind, `pids` (name -> pid of processes alive through the window), and
    with `children` (a label) what the bench's children that finished in the
    window used. The bench runs on the server's machine (make bench's
    throwaway cluster). `exclude`: backends of the bench's own sessions,
    besides this one's, which polls."""

    def __init__(self, bench: Bench, database: str, pids: dict[str, int] | None = None, children: str | None = None,
                 exclude: set[int] | None = None) -> None:
        self.bench, self.database, self.pids, self.children = bench, database, pids or {}, children
        self.exclude = set(exclude or ())

    def start(self) -> Split:
        self.session = Session(self.bench.db, self.database)
        # The postmaster: the parent of the session's backend, checked against
        # the data directory's postmaster.pid where it can be read.
        backend = self.session.backend_pid()
        if (stat := read_stat(backend)) is None:
            raise BenchError(f"no /proc/{backend}: Postgres is not on this machine (or not in this PID "
                             "namespace); its CPU cannot be read")
        self.postmaster, self.exclude = int(stat[1]), self.exclude | {backend}
        try:
            listed = int(Path(self.session.query("SHOW data_directory;")[0].strip(), "postmaster.pid")
                         .read_text().split("\n", 1)[0])
        except (BenchError, OSError, ValueError, IndexError):
            listed = self.postmaster
        if listed != self.postmaster:
            raise BenchError(f"backend {backend}'s parent ({self.postmaster}) is not the postmaster ({listed})")
        self.proc0 = {name: proc_cpu_secs(pid) or 0.0 for name, pid in self.pids.items()}
        self.children0 = children_cpu_secs()
        self.pg0, self.t0 = self.read(), time.monotonic()
        return self

    def read(self) -> tuple[int, int, dict]:
        """(postmaster's own ticks, its reaped children's, {(pid, start): ticks})."""
        children = {}
        for entry in os.scandir("/proc"):
            f = read_stat(entry.name) if entry.name.isdigit() else None
            if f is not None and int(f[1]) == self.postmaster:
                children[(int(entry.name), int(f[19]))] = int(f[11]) + int(f[12])
        if (pm := read_stat(self.postmaster)) is None:
            raise BenchError(f"the postmaster ({self.postmaster}) is gone")
        return int(pm[11]) + int(pm[12]), int(pm[13]) + int(pm[14]), children

    def stop(self) -> dict:
        try:
            (pm0, reaped0, live0), (pm1, reaped1, live1) = self.pg0, self.read()
            secs = time.monotonic() - self.t0
            # What each process alive at the end is: pid -> (backend_type, database, application_name).
            kinds = {int(pid): rest for pid, *rest in (row.split("|") for row in self.session.query(
                "SELECT pid, backend_type, coalesce(datname, ''), application_name FROM pg_stat_activity;"))}
            cpu = {name: round((proc_cpu_secs(pid) or 0.0) - self.proc0[name], 3) for name, pid in self.pids.items()}
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
            else:
                used[f"backend: {app or database}" if kind == "client backend" else f"background: {kind}"] += gained
        # The processes that exited in the window: what they used since it began.
        used["exited"] += reaped1 - reaped0 - sum(t for key, t in live0.items() if key not in live1)
        used["postmaster"] += pm1 - pm0
        pg = {"seconds": round(secs, 2), "cpu_secs": round(sum(used.values()) / TICK, 2),
              "split_secs": {k: round(v / TICK, 2) for k, v in used.most_common()},
              "excluded_secs": {k: round(v / TICK, 2) for k, v in excluded.items()}}
        return {"cpu_secs": {"postgres": pg["cpu_secs"], **cpu}, "postgres": pg}


def children_cpu_secs() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def per_unit(split: dict, n: int | float) -> dict:
    """Microseconds of CPU per unit of work, by part and in total."""
    parts = {k: round(v / n * 1e6, 1) for k, v in split["cpu_secs"].items()} if n else {}
    return {**parts, "total": round(sum(parts.values()), 1) if parts else None}


def brief(u: dict) -> str:
    """`per_unit`'s parts on one line."""
    return ", ".join(f"{k} {v}" for k, v in u.items())


def measured(bench: Bench, database: str, work) -> dict:
    """`work(session)`'s result and, as `window`, the Postgres CPU over it,
    `database`'s backends counted (the polling session's not)."""
    time.sleep(1.0)  # the reset's sessions gone, the services idle again
    split = Split(bench, database).start()
    try:
        out = work(split.session)
    finally:
        out["window"] = split.stop()["postgres"]
    return out


def product_run(bench: Bench, ingest: Service, rate: float, secs: float) -> dict:
    bench.product.reset(CFG["product_history"])
    bench.reset_downstream()

    def work(session: Session) -> dict:
        # --rate is events/s; 10% of events are delivered twice.
        s = provider_run(ingest, "db-cpu", rate=rate / (1 + DUPLICATE_RATE), secs=secs)
        session.wait_drained(120, "db_cpu product", every=0.1)
        answered = sum(n for code, n in (s.get("status_counts") or {}).items() if code.startswith("2"))
        if not answered or not s.get("acknowledged"):
            raise BenchError(f"db_cpu: the provider got no 2xx answer: {s.get('status_counts')}")
        return {"load": summary_brief(s), "units": answered, "new_events": s["acknowledged"]}

    return measured(bench, Product.DB, work)


def naive_run(bench: Bench, rate: float, secs: float) -> dict:
    db, url = bench.db, bench.db.url(Reference.DB)
    bench.ref.reset()
    total_rate = rate * (INGEST_WEIGHT + RELAY_WEIGHT) / INGEST_WEIGHT
    ingest_file, relay_file = REFS / "reference-ingest.sql", REFS / "reference-relay.sql"

    def work(session: Session) -> dict:
        _, out, err = run_cmd("pgbench db-cpu naive", [
            "pgbench", "-n", "-M", "prepared", "-c", REF_CLIENTS, "-j", 2, "-T", max(1, round(secs)),
            "-R", f"{total_rate:.1f}", "-D", f"run={time.time_ns()}", "-D", "n=0",
            "-f", f"{ingest_file}@{INGEST_WEIGHT}", "-f", f"{relay_file}@{RELAY_WEIGHT}", url],
            timeout=secs + 120, env=db.env())
        (LOGS / "pgbench-db-cpu-naive.out").write_text(out + err)
        # The ingest script's transactions: "SQL script 1: ...\n - weight: ...\n - N transactions (..."
        m = re.search(r"SQL script 1: [^\n]*\n - weight: [^\n]*\n - (\d+) transactions", out)
        if not m:
            raise BenchError(f"pgbench db-cpu naive: no per-script transactions in its output: {out[-500:]}")
        # The relay's share fell behind by chance (scripts are drawn at random):
        # it drains the rest on its own, inside the window.
        for attempt in range(20):
            if (pending := session.pending()) == 0:
                return {"units": int(m.group(1)), "rate_requested_tps": round(total_rate, 1)}
            if attempt >= 1:
                # A claim whose completion never ran (a client stopped in between) holds its rows for 60 s.
                session.query("UPDATE outbox SET locked_until = NULL WHERE status = 'pending' "
                              "AND locked_until > now();")
            run_cmd("pgbench db-cpu naive drain", ["pgbench", "-n", "-M", "prepared", "-c", 1,
                                                   "-t", math.ceil(pending / 50), "-f", relay_file, url],
                    timeout=120, env=db.env())
        raise BenchError("pgbench db-cpu naive: the outbox would not drain")

    return measured(bench, Reference.DB, work)


def run(bench: Bench) -> None:
    rate, ingest, own, rounds = bench.peak_rps() / 2, bench.ingest, [], []
    try:
        if ingest is None:
            ingest = bench.start_ingest("db-cpu")
            own.append(ingest)
        if not any(r.p.poll() is None for r in bench.relays):
            own.append(bench.start_relay("db-cpu"))
        # Two rounds of half the window each, in the order product, naive, then
        # naive, product: a drift of the machine weighs on each alike. The
        # reference runs at the rate the product's first run answered webhooks.
        for name in ("product", "naive", "naive", "product"):
            rounds.append(product_run(bench, ingest, rate, CFG["db_cpu_secs"] / 2) if name == "product" else
                          naive_run(bench, rounds[0]["load"]["requests_per_s"], CFG["db_cpu_secs"] / 2))
    finally:
        for service in own:
            service.stop()

    def us(runs: list[dict], key: str = "units") -> float:
        """Postgres CPU per unit of the runs, in microseconds."""
        return round(sum(x["window"]["cpu_secs"] for x in runs) / sum(x[key] for x in runs) * 1e6, 1)

    product, naive = [rounds[0], rounds[3]], [rounds[1], rounds[2]]
    r = bench.report
    r["db_cpu_rps"] = rounds[0]["load"]["requests_per_s"]
    r["db_cpu_us_per_webhook"], r["db_cpu_us_per_new_event"] = us(product), us(product, "new_events")
    r["db_cpu_us_per_webhook_naive"] = us(naive)
    r["db_cpu_vs_naive"] = ratio(r["db_cpu_us_per_webhook"], r["db_cpu_us_per_webhook_naive"])
    per_round = [ratio(us([p]), us([n])) for p, n in zip(product, naive)]
    bench.details["db_cpu"] = {"rate_target_rps": round(rate, 1), "rounds": rounds, "ratio_per_round": per_round}
    log(f"  db cpu at {r['db_cpu_rps']:,.0f} req/s: ours {r['db_cpu_us_per_webhook']} us/webhook "
        f"({r['db_cpu_us_per_new_event']} per new event) | naive {r['db_cpu_us_per_webhook_naive']} | ours/naive "
        f"{r['db_cpu_vs_naive']} (per round {per_round})")
