"""The `db_cpu` phase (runner.PHASES; the method: docs/BENCHMARK.md, "How
the figures are measured"). Postgres CPU of every process of the server, as
bench/README.md counts it, read from /proc: the postmaster (postmaster.pid,
or the parent of a backend) and its children, each child's utime + stime
gained in the window, the postmaster's own and its cutime + cstime for the
children that exited. A sampler reads the children every 0.2 s so exited
ones are still split by kind (their last 0.2 s is "exited, unattributed").
The bench's polling session, other databases' backends and the services'
own CPU are reported beside, never counted."""

from __future__ import annotations

import math
import os
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .common import CpuMeter, ratio, run_cmd
from .config import BENCH_REFERENCES, CFG, DUPLICATE_RATE, LOGS, BenchError, log
from .db import Product, Reference, Session
from .load import provider_run, summary_brief
from .services import Service

if TYPE_CHECKING:
    from .runner import Bench

TICK = os.sysconf("SC_CLK_TCK")
# pgbench's clients for the references (the ingest's default pool is 16).
REF_CLIENTS = 16
# 25 ingest transactions (2 outbox rows each) per relay transaction (a batch of 50).
INGEST_WEIGHT, RELAY_WEIGHT = 25, 1
BACKGROUND = ("checkpointer", "background writer", "walwriter", "autovacuum launcher", "autovacuum worker",
              "logical replication launcher", "logical replication worker", "archiver", "stats collector",
              "walsender", "walreceiver", "startup", "wal summarizer", "io worker")
TITLE = re.compile(r"^postgres: (?:[^:]+: )?(.*)$")


def read_stat(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields from the 3rd (state) on: [1] ppid, [11] utime,
    [12] stime, [13] cutime, [14] cstime, [19] starttime."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def title(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def kind_of(t: str) -> tuple[str, str]:
    """A server process's title -> (kind, database): kind is a background
    process's name or "backend"."""
    m = TITLE.match(t)
    if not m:
        return "backend", "(starting)"  # forked, its title not yet set
    rest = m.group(1)
    if rest.startswith("parallel worker"):
        return "backend", "(parallel worker)"
    for name in BACKGROUND:
        if rest.startswith(name):
            return name, ""
    parts = rest.split()
    return "backend", parts[1] if len(parts) > 1 else ""


class Server:
    """The Postgres server's processes, read from /proc: the bench runs on the
    server's machine (make bench's throwaway cluster)."""

    def __init__(self, postmaster: int) -> None:
        self.pid = postmaster

    @staticmethod
    def find(session: Session) -> "Server":
        """The postmaster: the parent of this session's backend, checked against
        the data directory's postmaster.pid where it can be read."""
        backend = int(session.query("SELECT pg_backend_pid();")[0])
        stat = read_stat(backend)
        if stat is None:
            raise BenchError(f"no /proc/{backend}: Postgres is not on this machine (or not in this PID "
                             "namespace); its CPU cannot be read")
        pm = int(stat[1])
        try:
            data_dir = session.query("SHOW data_directory;")[0].strip()
            listed = int(Path(data_dir, "postmaster.pid").read_text().split("\n", 1)[0])
        except (BenchError, OSError, ValueError, IndexError):
            listed = None
        if listed is not None and listed != pm:
            raise BenchError(f"postmaster.pid names {listed}, but backend {backend}'s parent is {pm}")
        if "postgres" not in title(pm) or read_stat(pm) is None:
            raise BenchError(f"backend {backend}'s parent ({pm}) is not a postmaster: {title(pm)!r}")
        return Server(pm)

    def read(self) -> tuple[tuple, tuple, dict]:
        """(postmaster's own (user, system) ticks, its reaped children's,
        {(pid, start): ((user, system), title)})."""
        children = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            f = read_stat(entry.name)
            if f is None or int(f[1]) != self.pid:
                continue
            pid = int(entry.name)
            children[(pid, int(f[19]))] = ((int(f[11]), int(f[12])), title(pid))
        pm = read_stat(self.pid)
        if pm is None:
            raise BenchError(f"the postmaster ({self.pid}) is gone")
        return (int(pm[11]), int(pm[12])), (int(pm[13]), int(pm[14])), children


class Window:
    """Postgres CPU between start() and stop(), split by process kind."""

    def __init__(self, server: Server, excluded_pids: set[int], databases: set[str]) -> None:
        self.server, self.excluded, self.databases = server, excluded_pids, databases
        self.seen: dict = {}
        self.stopping = threading.Event()

    def start(self) -> None:
        self.a = self.server.read()
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        while not self.stopping.wait(0.2):
            try:
                children = self.server.read()[2]
            except BenchError:
                return
            for key, (ticks, t) in children.items():
                # An exiting process's cmdline reads empty: keep the title it had.
                old = self.seen.get(key)
                self.seen[key] = (ticks, t if TITLE.match(t) or not old else old[1])

    def stop(self, apps: dict[int, str]) -> dict:
        """`apps`: pid -> application_name of the backends alive at the end."""
        b = self.server.read()
        secs = time.monotonic() - self.t0
        self.stopping.set()
        self.thread.join(timeout=5)
        (pm0, reaped0, live0), (pm1, reaped1, live1) = self.a, b
        used: dict = {}  # label -> [user, system] ticks
        excluded: dict = {}

        def add(into: dict, label: str, ticks) -> None:
            into.setdefault(label, [0, 0])
            into[label][0] += ticks[0]
            into[label][1] += ticks[1]

        def minus(a, b) -> tuple:
            return a[0] - b[0], a[1] - b[1]

        attributed_exited = [0, 0]
        for key, (ticks, t) in list(live1.items()) + [(k, v) for k, v in self.seen.items() if k not in live1]:
            gained = minus(ticks, live0.get(key, ((0, 0), ""))[0])
            alive = key in live1
            if not alive:
                add({"x": attributed_exited}, "x", gained)
            kind, database = kind_of(t)
            if kind != "backend":
                add(used, f"background: {kind}", gained)
            elif key[0] in self.excluded:
                add(excluded, "the bench's polling session", gained)
            elif database and not database.startswith("(") and database not in self.databases:
                add(excluded, f"backends of {database}", gained)
            else:
                app = apps.get(key[0]) if alive else None
                add(used, f"backend: {app or database or '?'}{'' if alive else ' (exited)'}", gained)
        gone = [0, 0]
        for key, (ticks, _) in live0.items():
            if key not in live1:
                add({"x": gone}, "x", ticks)
        add(used, "exited, unattributed", minus(minus(minus(reaped1, reaped0), gone), attributed_exited))
        add(used, "postmaster", minus(pm1, pm0))
        user = sum(v[0] for v in used.values())
        system = sum(v[1] for v in used.values())
        counted = user + system
        return {"seconds": round(secs, 2), "cpu_secs": round(counted / TICK, 2),
                "cores": round(counted / TICK / secs, 2) if secs else None,
                "user_secs": round(user / TICK, 2), "system_secs": round(system / TICK, 2),
                "split_secs": {k: round(sum(v) / TICK, 2) for k, v in sorted(used.items(), key=lambda x: -sum(x[1]))},
                "excluded_secs": {k: round(sum(v) / TICK, 2) for k, v in excluded.items()}}


def per_event(w: dict, n: int) -> dict:
    """The window's CPU in microseconds per event, in total and by group."""
    groups: dict = {"backends": 0.0, "background": 0.0, "exited, unattributed": 0.0, "postmaster": 0.0}
    for label, secs in w["split_secs"].items():
        group = "backends" if label.startswith("backend") else "background" if label.startswith("background") \
            else label
        groups[group] = groups.get(group, 0.0) + secs
    return {"total": round(w["cpu_secs"] / n * 1e6, 1), "user": round(w["user_secs"] / n * 1e6, 1),
            "system": round(w["system_secs"] / n * 1e6, 1),
            **{k: round(v / n * 1e6, 1) for k, v in groups.items()}}


def backend_apps(session: Session) -> dict[int, str]:
    apps = {}
    for row in session.query("SELECT pid, coalesce(application_name, '') FROM pg_stat_activity "
                             "WHERE backend_type = 'client backend';"):
        pid, _, app = row.partition("|")
        apps[int(pid)] = app
    return apps


def wait_drained(session: Session, what: str, timeout: float = 120.0) -> float:
    t0 = time.monotonic()
    while True:
        pending = int(session.query("SELECT count(*) FROM outbox WHERE status = 'pending';")[0])
        if pending == 0:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise BenchError(f"{what}: {pending} outbox rows still pending {timeout:.0f}s after the load")
        time.sleep(0.1)


def product_run(bench: Bench, server: Server, ingest: Service, relay: Service, rate: float,
                secs: float) -> dict:
    bench.product.reset(CFG["product_history"])
    bench.services.reset_downstream()
    session = Session(bench.db, Product.DB)
    try:
        poll_pid = int(session.query("SELECT pg_backend_pid();")[0])
        time.sleep(1.0)  # the reset's sessions gone, the services idle again
        window = Window(server, {poll_pid}, {Product.DB})
        relay_cpu0 = relay.cpu() or 0.0
        meter = CpuMeter()
        window.start()
        # --rate is events/s; 10% of events are delivered twice.
        s = provider_run(ingest.url, "db-cpu", ingest, rate=rate / (1 + DUPLICATE_RATE), secs=secs)
        drain_secs = wait_drained(session, "db_cpu product")
        cpu = window.stop(backend_apps(session))
        cores = meter.cores_busy()
        relay_cpu = (relay.cpu() or 0.0) - relay_cpu0
    finally:
        session.close()
    effects = bench.services.stats()
    answered = sum(n for code, n in (s.get("status_counts") or {}).items() if code.startswith("2"))
    new = s.get("acknowledged") or 0
    if not answered or not new:
        raise BenchError(f"db_cpu: the provider got no 2xx answer: {s.get('status_counts')}")
    out = {"load": summary_brief(s), "webhooks_answered": answered, "new_events": new,
           "seconds_to_drained_after_load": round(drain_secs, 2), "window": cpu,
           "us_per_webhook": per_event(cpu, answered), "us_per_new_event": per_event(cpu, new),
           "machine_cores_busy": cores, "not_counted_services_cpu_secs": {
               "ingest": s.get("ingest_cpu_secs"), "relay": round(relay_cpu, 2)},
           "downstream_effects": effects.get("effects"), "double_effects": effects.get("double_effects")}
    if s.get("problems"):
        out["problems"] = s["problems"]
    return out


def pgbench_tx(out: str, script: int) -> tuple[int, float] | None:
    m = re.search(rf"SQL script {script}: [^\n]*\n - weight: [^\n]*\n - (\d+) transactions "
                  rf"\([^,]*, tps = ([\d.]+)\)", out)
    return (int(m.group(1)), float(m.group(2))) if m else None


def reference_run(bench: Bench, server: Server, name: str, ingest_file: str, relay_file: str,
                  rate: float, secs: float) -> dict:
    db = bench.db
    bench.ref.reset()
    session = Session(db, Reference.DB)
    try:
        poll_pid = int(session.query("SELECT pg_backend_pid();")[0])
        time.sleep(1.0)
        window = Window(server, {poll_pid}, {Reference.DB})
        total_rate = rate * (INGEST_WEIGHT + RELAY_WEIGHT) / INGEST_WEIGHT
        args = ["pgbench", "-n", "-M", "prepared", "-c", REF_CLIENTS, "-j", 2, "-T", max(1, round(secs)),
                "-R", f"{total_rate:.1f}", "-D", f"run={time.time_ns()}", "-D", "n=0",
                "-f", f"{BENCH_REFERENCES / ingest_file}@{INGEST_WEIGHT}",
                "-f", f"{BENCH_REFERENCES / relay_file}@{RELAY_WEIGHT}", db.url(Reference.DB)]
        meter = CpuMeter()
        window.start()
        _, out, err = run_cmd(f"pgbench db-cpu {name}", args, timeout=secs + 120, env=db.env())
        load_secs = time.monotonic() - window.t0
        (LOGS / f"pgbench-db-cpu-{name}.out").write_text(out + err)
        ingest_tx, relay_tx = pgbench_tx(out, 1), pgbench_tx(out, 2)
        if not ingest_tx or not relay_tx:
            raise BenchError(f"pgbench db-cpu {name}: no per-script transactions in its output: {out[-500:]}")
        # The relay's share fell behind by chance (scripts are drawn at random):
        # it drains the rest on its own, inside the window.
        t_drain = time.monotonic()
        drain_tx = 0
        unlocked = 0
        for attempt in range(20):
            pending = int(session.query("SELECT count(*) FROM outbox WHERE status = 'pending';")[0])
            if pending == 0:
                break
            if attempt >= 1:
                # A claim whose completion never ran (a client stopped in between) holds its rows for 60 s.
                unlocked += int(session.query(
                    "WITH u AS (UPDATE outbox SET locked_until = NULL WHERE status = 'pending' AND "
                    "locked_until > now() RETURNING 1) SELECT count(*) FROM u;")[0])
            batches = math.ceil(pending / 50)
            drain_tx += batches
            run_cmd(f"pgbench db-cpu {name} drain", ["pgbench", "-n", "-M", "prepared", "-c", 1, "-t", batches,
                                                     "-f", BENCH_REFERENCES / relay_file, db.url(Reference.DB)],
                    timeout=120, env=db.env())
        else:
            raise BenchError(f"pgbench db-cpu {name}: the outbox would not drain")
        drain_secs = time.monotonic() - t_drain
        cpu = window.stop(backend_apps(session))
        cores = meter.cores_busy()
        rows = int(session.query("SELECT count(*) FROM outbox;")[0])
    finally:
        session.close()
    n = ingest_tx[0]
    failed = re.search(r"number of failed transactions: (\d+)", out)
    return {"files": [f"{ingest_file}@{INGEST_WEIGHT}", f"{relay_file}@{RELAY_WEIGHT}"],
            "clients": REF_CLIENTS, "rate_requested_tps": round(total_rate, 1),
            "ingest_transactions": n, "ingest_tps": ingest_tx[1], "relay_transactions": relay_tx[0],
            "relay_tps": relay_tx[1], "drain_relay_transactions": drain_tx, "outbox_rows": rows,
            "claims_unlocked_before_drain": unlocked,
            "failed_transactions": int(failed.group(1)) if failed else None,
            "load_secs": round(load_secs, 2), "drain_secs": round(drain_secs, 2), "window": cpu,
            "us_per_ingest_transaction": per_event(cpu, n), "machine_cores_busy": cores}


def merged(runs: list[dict]) -> dict:
    """The rounds' windows added up: CPU, seconds and the split."""
    out: dict = {"seconds": 0.0, "cpu_secs": 0.0, "user_secs": 0.0, "system_secs": 0.0, "split_secs": {},
                 "excluded_secs": {}}
    for w in (r["window"] for r in runs):
        for k in ("seconds", "cpu_secs", "user_secs", "system_secs"):
            out[k] = round(out[k] + w[k], 2)
        for part in ("split_secs", "excluded_secs"):
            for k, v in w[part].items():
                out[part][k] = round(out[part].get(k, 0.0) + v, 2)
    out["split_secs"] = dict(sorted(out["split_secs"].items(), key=lambda x: -x[1]))
    return out


def run(bench: Bench) -> None:
    session = Session(bench.db, Product.DB)
    try:
        server = Server.find(session)
    finally:
        session.close()
    try:
        rate, rate_from = bench.peak_rps() / 2, "half of the ingest's peak"
    except BenchError:
        rate, rate_from = CFG["db_cpu_fallback_rps"], "no peak measured: the fallback rate"
    ingest, own = bench.ingest, []
    relay = next((r for r in bench.relays if r.p.poll() is None), None)
    # Two rounds of half the window each, in the order product, naive, limit,
    # then limit, naive, product: a drift of the machine weighs on each alike.
    secs = CFG["db_cpu_secs"] / 2
    runs: dict = {"product": [], "naive": [], "limit": []}
    same = None
    try:
        if ingest is None:
            ingest = bench.services.start_ingest("db-cpu")
            own.append(ingest)
        if relay is None:
            relay = bench.services.start_relay("db-cpu")
            own.append(relay)
        for order in (("product", "naive", "limit"), ("limit", "naive", "product")):
            for name in order:
                if name == "product":
                    runs[name].append(product_run(bench, server, ingest, relay, rate, secs))
                    # The references at the rate the product's first run answered webhooks.
                    same = same or runs[name][0]["load"]["requests_per_s"]
                else:
                    files = (("reference-ingest.sql", "reference-relay.sql") if name == "naive" else
                             ("reference-ingest-one-statement.sql", "reference-relay-one-statement.sql"))
                    runs[name].append(reference_run(bench, server, name, *files, same or rate, secs))
    finally:
        for service in own:
            service.stop()
    product = {"window": merged(runs["product"]),
               "webhooks_answered": sum(x["webhooks_answered"] for x in runs["product"]),
               "new_events": sum(x["new_events"] for x in runs["product"])}
    product["us_per_webhook"] = per_event(product["window"], product["webhooks_answered"])
    product["us_per_new_event"] = per_event(product["window"], product["new_events"])
    refs = {}
    for name in ("naive", "limit"):
        n = sum(x["ingest_transactions"] for x in runs[name])
        refs[name] = {"window": merged(runs[name]), "ingest_transactions": n,
                      "ingest_tps": round(sum(x["ingest_tps"] for x in runs[name]) / len(runs[name]), 1)}
        refs[name]["us_per_ingest_transaction"] = per_event(refs[name]["window"], n)
    naive, limit = refs["naive"], refs["limit"]
    bench.details["db_cpu"] = {
        "postmaster_pid": server.pid, "rate_target_rps": round(rate, 1), "rate_from": rate_from,
        "references_rate_rps": same, "product": product, "naive": naive, "limit": limit, "rounds": runs,
        "ratio_per_round": [ratio(runs["product"][i]["us_per_webhook"]["total"],
                                  runs["naive"][i]["us_per_ingest_transaction"]["total"]) for i in (0, 1)]}
    r = bench.report
    r["db_cpu_us_per_webhook"] = product["us_per_webhook"]["total"]
    r["db_cpu_us_per_new_event"] = product["us_per_new_event"]["total"]
    r["db_cpu_us_per_webhook_naive"] = naive["us_per_ingest_transaction"]["total"]
    r["db_cpu_us_per_webhook_limit"] = limit["us_per_ingest_transaction"]["total"]
    r["db_cpu_vs_naive"] = ratio(r["db_cpu_us_per_webhook"], r["db_cpu_us_per_webhook_naive"])
    r["db_cpu_vs_limit"] = ratio(r["db_cpu_us_per_webhook"], r["db_cpu_us_per_webhook_limit"])
    # The one-statement design against the naive: how far below the naive
    # any design writing the same rows reaches.
    r["db_cpu_limit_vs_naive"] = ratio(r["db_cpu_us_per_webhook_limit"], r["db_cpu_us_per_webhook_naive"])
    r["db_cpu_rps"] = same
    p = product["us_per_webhook"]
    log(f"  db cpu at {same:,.0f} req/s: ours {p['total']} us/webhook (backends {p['backends']}, background "
        f"{p['background']}; {r['db_cpu_us_per_new_event']} per new event) | naive "
        f"{r['db_cpu_us_per_webhook_naive']} at {naive['ingest_tps']:,.0f} tps | limit "
        f"{r['db_cpu_us_per_webhook_limit']} at {limit['ingest_tps']:,.0f} tps | ours/naive "
        f"{r['db_cpu_vs_naive']} (per round {bench.details['db_cpu']['ratio_per_round']})")
