#!/usr/bin/env python3
"""`make bench`: the benchmark report of README, Performance, measured in ONE run on ONE
Postgres server (DATABASE_URL, an admin URL allowed to CREATE DATABASE).

    make bench                  # full: about 8 minutes
    BENCH_QUICK=1 make bench    # quick: under 2 minutes, smaller sizes, same keys

What it does, in order (each phase's wall time is in the report):

 1. setup     databases bench_product (migrated, 1M orders, some history),
              bench_ref (bench/schema.sql), bench_peer (empty); the
              downstream simulator; the peer's node_modules (once).
 2. ingest    closed loop at 1, 16 and 64 senders (signed, 10% duplicates),
              each beside pgbench running both reference files at the same
              concurrency and duration; every run starts from the same state.
 3. half load open loop at half of the measured peak: p99.
 4. relay     50,000 rows inserted at once (one statement + NOTIFY) while the
              relay is running and idle; three back-to-back drains with one
              relay (no manual VACUUM between them), then one with two relays
              (after a VACUUM, so it starts where the first did).
 5. peer      graphile-worker draining as many no-op jobs (bench_peer).
 6. e2e       webhook accepted -> downstream effect, idle (events one by one)
              and while a provider load runs at half of peak.
 7. tracing   a short 64-sender run with and without OTLP export (to a local sink).
 7b. relay_log the relay's log line per call (README, Tracing one event): drains with it on
              (the default level) and off (RUST_LOG=warn), alternated on, off,
              off, on; the ratio of the rates is its cost.
 8. prune     retention under load: 1M done outbox rows and 1M processed events
              30 days old (quick: 50k and 50k); the ingest at half of peak (open
              loop) for a baseline window, then while `outbox-relay prune`
              deletes them: p50/p99 of both, the prune's time and rows/s.
 9. growth    64 senders and the relay's claim with 1M / 10M processed events
              and 1M done outbox rows (quick: 100k / 500k and 100k); a history
              the time budget cannot generate is cut, and the report says so.

While working on one phase: BENCH_PHASES=prune (a comma-separated list; setup
always runs) and BENCH_PEAK_RPS=<req/s> in place of the ingest phase's peak.
Such a run's report is partial and says which phases ran.

Writes target/bench/report.json, target/bench/report.md, logs under
target/bench/logs/. Standard library only. Every process it starts is stopped
on exit, on Ctrl-C and on SIGTERM; every wait is bounded.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import os
import platform
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release"
OUT = ROOT / "target" / "bench"
LOGS = OUT / "logs"
BENCH_REFERENCES = ROOT / "bench"
QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0", "false", "no")

# Sizes and durations per mode. BENCH_SECS overrides the ingest run length.
if QUICK:
    CFG = dict(
        mode="quick",
        ingest_secs=3.0,
        half_secs=4.0,
        trace_secs=3.0,
        relay_rows=10_000,
        log_line_rows=10_000,
        peer_jobs=10_000,
        e2e_idle_events=40,
        e2e_load_secs=5.0,
        growth_secs=3.0,
        growth_histories=(100_000, 500_000),
        growth_outbox_done=100_000,
        prune_outbox_rows=50_000,
        prune_events=50_000,
        prune_timeout_secs=90,
        product_history=5_000,
        budget_secs=110,
    )
else:
    CFG = dict(
        mode="full",
        ingest_secs=15.0,
        half_secs=15.0,
        trace_secs=8.0,
        relay_rows=50_000,
        log_line_rows=20_000,
        peer_jobs=50_000,
        e2e_idle_events=100,
        e2e_load_secs=10.0,
        growth_secs=8.0,
        growth_histories=(1_000_000, 10_000_000),
        growth_outbox_done=1_000_000,
        prune_outbox_rows=1_000_000,
        prune_events=1_000_000,
        prune_timeout_secs=240,
        product_history=50_000,
        budget_secs=560,
    )
if os.environ.get("BENCH_SECS"):
    CFG["ingest_secs"] = float(os.environ["BENCH_SECS"])
ONLY = {p.strip() for p in os.environ.get("BENCH_PHASES", "").split(",") if p.strip()}

CONCURRENCIES = (1, 16, 64)
ORDERS = 1_000_000  # as the reference schema: pay_1 .. pay_1000000
DUPLICATE_RATE = 0.1
# Duplicates follow their first delivery within 100 ms (the provider's default
# is up to 1 s): a short run would otherwise end on a second of trailing
# duplicates at a fraction of the load, understating the rate.
DUPLICATE_DELAY = "0..100"
E2E_RATE = 20.0  # events per second sent one by one for the end-to-end figures
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
SECRET = "whsec_" + base64.b64encode(b"make-bench-secret-24byte").decode()
# Order ranges, so no phase's idempotency keys meet another's.
E2E_IDLE_ORDER0 = 990_000
E2E_LOAD_ORDER0 = 995_000
HISTORY_ORDER0 = 5_000_000
DRAIN_ORDER0 = 20_000_000
PRUNE_ORDER0 = 40_000_000
# The prune phase's old rows are this old; the prune runs with the default retention.
PRUNE_AGE_DAYS = 30
RETENTION_DAYS = 7

# The product reads these; the bench measures its defaults, so they are unset
# for the processes it starts (and recorded if the caller had set them).
PRODUCT_VARS = re.compile(
    r"^(OTEL_|RUST_LOG$|LOG_FORMAT$|DATABASE_(?!URL$)|RELAY_|INGEST_|WEBHOOK_|ADMIN_LISTEN_ADDR$|"
    r"FULFILMENT_URL$|EMAIL_URL$|RETENTION_DAYS$|PROVIDER_|DOWNSTREAM_)"
)


class BenchError(Exception):
    pass


T0 = time.monotonic()
LOAD0 = os.getloadavg()  # what else the machine was doing when the bench started


def log(msg: str) -> None:
    print(f"[bench {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


# --------------------------------------------------------------------------
# Processes: every one started goes into the registry and is stopped at exit.


class Procs:
    def __init__(self) -> None:
        self.items: list[tuple[str, subprocess.Popen]] = []
        self.lock = threading.Lock()

    def popen(self, name: str, args: list[str], **kw) -> subprocess.Popen:
        # Own session: a Ctrl-C reaches only this script, which then stops
        # its children in order (SIGTERM, then SIGKILL after a grace period).
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen([str(a) for a in args], **kw)
        with self.lock:
            self.items.append((name, p))
        return p

    def stop(self, p: subprocess.Popen, grace: float = 15.0) -> int | None:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                p.kill()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            except ProcessLookupError:
                pass
        with self.lock:
            self.items = [(n, q) for n, q in self.items if q is not p]
        for stream in (p.stdin, p.stdout, p.stderr):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass
        return p.returncode

    def stop_all(self) -> None:
        with self.lock:
            items = list(reversed(self.items))
        for _, p in items:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for _, p in items:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        for _, p in items:
            self.stop(p, grace=1)


PROCS = Procs()


def run_cmd(name: str, args: list, timeout: float, env: dict | None = None, cwd=None,
            stdin: str | None = None, check: bool = True) -> tuple[int, str, str]:
    """Runs a command to completion (bounded by `timeout`); returns (rc, out, err)."""
    p = PROCS.popen(name, args, env=env, cwd=cwd, text=True,
                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(input=stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        PROCS.stop(p, grace=5)
        raise BenchError(f"{name} did not finish within {timeout:.0f}s")
    finally:
        if p.poll() is not None:
            PROCS.stop(p)
    if check and p.returncode != 0:
        raise BenchError(f"{name} exited {p.returncode}: {(err or out).strip()[-2000:]}")
    return p.returncode, out, err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_post(url: str, body: bytes = b"", timeout: float = 5.0) -> int:
    req = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def wait_ready(url: str, p: subprocess.Popen, name: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise BenchError(f"{name} exited ({p.returncode}) before it was ready; see {LOGS}")
        try:
            if http_get(url, timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise BenchError(f"{name} not ready at {url} within {timeout:.0f}s; see {LOGS}")


def rss_mib(pid: int) -> dict:
    """Peak (VmHWM) and current (VmRSS) resident memory of a live process."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmHWM:", "VmRSS:")):
                key, value = line.split(":", 1)
                out[key] = round(int(value.split()[0]) / 1024, 1)
    except OSError:
        pass
    return {"peak_mib": out.get("VmHWM"), "current_mib": out.get("VmRSS")}


def proc_cpu_secs(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class CpuMeter:
    """The machine's CPU use (all processes) between start and stop, in cores."""

    @staticmethod
    def _read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]
        return sum(fields[:8]) - idle, sum(fields[:8])

    def __init__(self) -> None:
        self.busy0, self.total0 = self._read()
        self.t0 = time.monotonic()

    def cores_busy(self) -> float:
        busy, total = self._read()
        if total == self.total0:
            return 0.0
        return round((busy - self.busy0) / (total - self.total0) * (os.cpu_count() or 1), 2)


# --------------------------------------------------------------------------
# Postgres through psql (the standard library has no driver).


class Db:
    def __init__(self, admin_url: str) -> None:
        self.admin = admin_url
        m = re.match(r"^(postgres(?:ql)?://[^/?#]*)(/[^?#]*)?(\?.*)?$", admin_url)
        if not m:
            raise BenchError("DATABASE_URL must be a postgres:// URL (make bench sets it)")
        self.base, self.query = m.group(1), m.group(3) or ""

    def url(self, db: str) -> str:
        return f"{self.base}/{db}{self.query}"

    def env(self) -> dict:
        env = clean_env()
        env.setdefault("PGCONNECT_TIMEOUT", "10")
        return env

    def sql(self, db: str, sql: str, timeout: float = 120.0) -> list[str]:
        """Runs SQL (one or more statements) in one psql process; rows as 'a|b' lines."""
        _, out, _ = run_cmd(f"psql {db}", ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                                           "-d", self.url(db)],
                            timeout=timeout, env=self.env(), stdin=sql)
        return [line for line in out.splitlines() if line != ""]

    def one(self, db: str, sql: str, timeout: float = 60.0) -> str:
        rows = self.sql(db, sql, timeout)
        return rows[-1] if rows else ""

    def recreate(self, db: str) -> None:
        self.sql_admin(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        self.sql_admin(f"CREATE DATABASE {db}")

    def sql_admin(self, sql: str, timeout: float = 120.0) -> list[str]:
        _, out, _ = run_cmd("psql admin", ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                                           "-d", self.admin, "-c", sql],
                            timeout=timeout, env=self.env())
        return out.splitlines()


class Session:
    """One persistent psql connection: for polling and for timed statements
    without a process (and a connection) per query."""

    def __init__(self, db: Db, name: str) -> None:
        self.p = PROCS.popen(f"psql session {name}",
                             ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=0", "-d", db.url(name)],
                             env=db.env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        self.buf = b""
        self.n = 0

    def send(self, sql: str) -> str:
        self.n += 1
        marker = f"__bench_{self.n}__"
        assert self.p.stdin
        self.p.stdin.write(f"{sql}\n\\echo {marker}\n".encode())
        self.p.stdin.flush()
        return marker

    def wait(self, marker: str, timeout: float = 60.0) -> list[str]:
        deadline = time.monotonic() + timeout
        lines: list[str] = []
        fd = self.p.stdout.fileno()  # type: ignore[union-attr]
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                text = line.decode(errors="replace")
                if text == marker:
                    errors = [x for x in lines if "ERROR:" in x or "FATAL:" in x]
                    if errors:
                        raise BenchError("psql: " + " / ".join(errors))
                    return [x for x in lines if x]
                lines.append(text)
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"psql session: no answer within {timeout:.0f}s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise BenchError("psql session ended: " + " / ".join(lines[-5:]))
                self.buf += chunk

    def query(self, sql: str, timeout: float = 60.0) -> list[str]:
        return self.wait(self.send(sql), timeout)

    def close(self) -> None:
        try:
            if self.p.stdin:
                self.p.stdin.write(b"\\q\n")
                self.p.stdin.flush()
        except OSError:
            pass
        PROCS.stop(self.p, grace=5)


def clean_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not PRODUCT_VARS.match(k)}
    env.pop("DATABASE_URL", None)
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


# --------------------------------------------------------------------------
# SQL of the setup, the resets and the history generators.

def history_events_sql(first: int, last: int, total: int, *, seed: str = "hist",
                       order0: int = HISTORY_ORDER0, days_ago: int = 0) -> str:
    """Processed events as the ingest writes them, `processed_at` spread over the
    six days before `days_ago` (by default the last six, inside the 7-day
    retention, so nothing is pruned), ids random like a real provider's
    (evt_ + 24 hex of md5(seed || n)), orders `order0` + n."""
    return f"""
INSERT INTO processed_events (event_id, event_type, status, processed_at, result, payload, order_id,
                              deliveries, last_delivered_at, trace_context)
SELECT 'evt_' || h, 'payment.succeeded', 'processed', t,
       ('{{"event_id":"evt_' || h || '","status":"processed","order_id":' || o || '}}')::jsonb,
       ('{{"id":"evt_' || h || '","type":"payment.succeeded","data":{{"payment_id":"pay_' || o
        || '","amount":4200,"currency":"gbp"}}}}')::jsonb,
       o, 1, t, '{TRACEPARENT}'
FROM generate_series({first}, {last}) n,
     LATERAL (SELECT now() - interval '{days_ago} days' - ({total} - n) * (interval '6 days' / {total}) AS t,
                     {order0} + n AS o, substr(md5('{seed}' || n), 1, 24) AS h OFFSET 0) x
"""


def history_outbox_sql(first: int, last: int, total: int, *, order0: int = HISTORY_ORDER0,
                       days_ago: int = 0) -> str:
    """Done outbox rows (two per order `order0` + n: shipment and confirmation),
    finished ~20 ms after they were created, over the six days before
    `days_ago` (by default the last six)."""
    return f"""
INSERT INTO outbox (kind, payload, idempotency_key, status, attempts, event_id, order_id, trace_context,
                    created_at, available_at, finished_at)
SELECT k.kind, ('{{"v":1,"order_id":' || o || ',"event_id":"evt_h' || o || '"}}')::jsonb, k.prefix || '-' || o,
       'done', 1, 'evt_h' || o, o, '{TRACEPARENT}', t, t, t + interval '20 milliseconds'
FROM generate_series({first}, {last}) n,
     LATERAL (SELECT now() - interval '{days_ago} days' - ({total} - n) * (interval '6 days' / {total}) AS t,
                     {order0} + n AS o) x,
     (VALUES ('ship_order', 'ship'), ('send_confirmation', 'conf')) AS k(kind, prefix)
"""


def drain_rows_sql(first_order: int, rows: int) -> str:
    """`rows` pending commands (half shipments, half confirmations), due now."""
    last = first_order + rows // 2 - 1
    return f"""
INSERT INTO outbox (kind, payload, idempotency_key, event_id, order_id, trace_context)
SELECT k.kind, jsonb_build_object('v', 1, 'order_id', o, 'event_id', 'evt_' || o), k.prefix || '-' || o,
       'evt_' || o, o, '{TRACEPARENT}'
FROM generate_series({first_order}, {last}) o,
     (VALUES ('ship_order', 'ship'), ('send_confirmation', 'conf')) AS k(kind, prefix)
"""


class Product:
    """bench_product: the product's schema, 1M orders and a realistic history."""

    DB = "bench_product"

    def __init__(self, db: Db) -> None:
        self.db = db

    def create(self) -> None:
        self.db.recreate(self.DB)
        run_cmd("webhook-ingest migrate", [BIN / "webhook-ingest", "migrate"], timeout=120,
                env=clean_env({"DATABASE_URL": self.db.url(self.DB), "LOG_FORMAT": "json"}))
        self.db.sql(self.DB, f"INSERT INTO orders (id, payment_id) SELECT n, 'pay_' || n "
                             f"FROM generate_series(1, {ORDERS}) n; VACUUM ANALYZE orders;", timeout=300)

    def reset(self, history: int) -> None:
        """Every measured run starts here: `history` processed events and done
        outbox rows (so prepared statements settle on their steady-state plans,
        not on an empty table's), every order pending, vacuumed, analyzed,
        checkpointed."""
        self.db.sql(self.DB, f"""
TRUNCATE processed_events, outbox;
{history_events_sql(1, history, history)};
{history_outbox_sql(1, history // 2, history // 2)};
UPDATE orders SET status = 'pending', updated_at = now() WHERE status <> 'pending';
VACUUM ANALYZE orders;
VACUUM ANALYZE processed_events;
VACUUM ANALYZE outbox;
CHECKPOINT;
""", timeout=600)


class Reference:
    DB = "bench_ref"

    def __init__(self, db: Db) -> None:
        self.db = db

    def create(self) -> None:
        self.db.recreate(self.DB)
        self.db.sql(self.DB, (BENCH_REFERENCES / "schema.sql").read_text(), timeout=300)

    def reset(self) -> None:
        # As bench/README.md says: empty the written tables, reset the orders.
        self.db.sql(self.DB, """
TRUNCATE processed_events, outbox;
UPDATE orders SET status = 'pending', paid_at = NULL WHERE status <> 'pending';
VACUUM ANALYZE orders;
ANALYZE processed_events; ANALYZE outbox;
CHECKPOINT;
""", timeout=300)


# --------------------------------------------------------------------------
# The services and the load.


class Services:
    def __init__(self, db: Db) -> None:
        self.db = db
        self.downstream: subprocess.Popen | None = None
        self.downstream_url = ""

    def start_downstream(self) -> None:
        logf = open(LOGS / "downstream.log", "ab")
        p = PROCS.popen("simulator downstream", [BIN / "simulator", "downstream", "--listen", "127.0.0.1:0"],
                        env=clean_env(), stdout=subprocess.PIPE, stderr=logf)
        line = read_line(p, timeout=30)
        try:
            addr = json.loads(line)["listening"]
        except (ValueError, KeyError):
            raise BenchError(f"simulator downstream: unexpected first line {line!r}")
        # Drain anything else it prints, so it can never block on a full pipe.
        threading.Thread(target=copy_stream, args=(p.stdout, logf), daemon=True).start()
        self.downstream = p
        self.downstream_url = f"http://{addr}"

    def stats(self, keys: bool = False, timeout: float = 60.0) -> dict:
        status, body = http_get(f"{self.downstream_url}/stats" + ("" if keys else "?keys=false"), timeout)
        if status != 200:
            raise BenchError(f"downstream /stats answered {status}")
        return json.loads(body)

    def reset_downstream(self) -> None:
        if http_post(f"{self.downstream_url}/control/reset") >= 300:
            raise BenchError("downstream /control/reset failed")

    def start_ingest(self, tag: str, extra_env: dict | None = None) -> "Service":
        port, admin = free_port(), free_port()
        env = clean_env({
            "DATABASE_URL": self.db.url(Product.DB),
            "WEBHOOK_SECRETS": SECRET,
            "INGEST_LISTEN_ADDR": f"127.0.0.1:{port}",
            "ADMIN_LISTEN_ADDR": f"127.0.0.1:{admin}",
        })
        env.update(extra_env or {})
        logf = open(LOGS / f"ingest-{tag}.log", "ab")
        p = PROCS.popen(f"webhook-ingest {tag}", [BIN / "webhook-ingest"], env=env, stdout=logf,
                        stderr=subprocess.STDOUT)
        wait_ready(f"http://127.0.0.1:{admin}/readyz", p, f"webhook-ingest ({tag})")
        return Service(p, f"http://127.0.0.1:{port}", tag)

    def start_relay(self, tag: str, extra_env: dict | None = None) -> "Service":
        admin = free_port()
        env = clean_env({
            "DATABASE_URL": self.db.url(Product.DB),
            "FULFILMENT_URL": self.downstream_url,
            "EMAIL_URL": self.downstream_url,
            "ADMIN_LISTEN_ADDR": f"127.0.0.1:{admin}",
        })
        env.update(extra_env or {})
        logf = open(LOGS / f"relay-{tag}.log", "ab")
        p = PROCS.popen(f"outbox-relay {tag}", [BIN / "outbox-relay"], env=env, stdout=logf,
                        stderr=subprocess.STDOUT)
        wait_ready(f"http://127.0.0.1:{admin}/readyz", p, f"outbox-relay ({tag})")
        return Service(p, "", tag)


class Service:
    def __init__(self, p: subprocess.Popen, url: str, tag: str) -> None:
        self.p, self.url, self.tag = p, url, tag

    def rss(self) -> dict:
        return rss_mib(self.p.pid)

    def cpu(self) -> float | None:
        return proc_cpu_secs(self.p.pid)

    def stop(self) -> None:
        rc = PROCS.stop(self.p, grace=20)
        if rc not in (0, None):
            log(f"  note: {self.tag} exited {rc} on SIGTERM")


def read_line(p: subprocess.Popen, timeout: float) -> str:
    fd = p.stdout.fileno()  # type: ignore[union-attr]
    buf = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or p.poll() is not None:
            raise BenchError(f"no output line within {timeout:.0f}s (exit {p.poll()}); see {LOGS}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise BenchError("process closed its output")
            buf += chunk
    return buf.split(b"\n", 1)[0].decode()


def copy_stream(src, dst) -> None:
    try:
        for chunk in iter(lambda: src.read1(65536), b""):
            dst.write(chunk)
            dst.flush()
    except (OSError, ValueError):
        pass


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


def pgbench(db: Db, file: Path, clients: int, secs: float, tag: str) -> dict:
    prefix = LOGS / f"pgbench-{tag}"
    for old in LOGS.glob(f"pgbench-{tag}.*"):
        old.unlink()
    args = ["pgbench", "-n", "-M", "prepared", "-c", clients, "-j", min(2, clients), "-T", max(1, round(secs)),
            "-D", f"run={time.time_ns()}", "-D", "n=0", "-f", file,
            # A sample of per-transaction latencies, for p50/p99 beside ours.
            "-l", "--sampling-rate=0.2", f"--log-prefix={prefix}", db.url(Reference.DB)]
    meter = CpuMeter()
    _, out, err = run_cmd(f"pgbench {tag}", args, timeout=secs + 120, env=db.env())
    cores = meter.cores_busy()
    (LOGS / f"pgbench-{tag}.out").write_text(out + err)
    m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    if not m:
        raise BenchError(f"pgbench {tag}: no tps in its output: {out[-500:]}")
    failed = re.search(r"number of failed transactions: (\d+)", out)
    lat = []
    for f in LOGS.glob(f"pgbench-{tag}.*"):
        if f.suffix == ".out":
            continue
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3:
                lat.append(int(parts[2]) / 1000.0)
        f.unlink()
    return {"tps": float(m.group(1)), "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
            "failed": int(failed.group(1)) if failed else None, "machine_cores_busy": cores,
            "latency_samples": len(lat)}


def hlabel(n: int) -> str:
    """1000000 -> "1m", 500000 -> "500k": the history sizes in key names."""
    return f"{n // 1_000_000}m" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k"


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    k = min(len(v) - 1, max(0, int(round(p / 100.0 * len(v) + 0.5)) - 1))
    return round(v[k], 2)


def ratio(a, b) -> float | None:
    if a is None or not b:
        return None
    return round(a / b, 3)


# --------------------------------------------------------------------------
# Signed webhooks from Python, for the end-to-end figures.


class Sender:
    def __init__(self, url: str) -> None:
        m = re.match(r"http://([^:/]+):(\d+)", url)
        assert m
        self.host, self.port = m.group(1), int(m.group(2))
        self.key = base64.b64decode(SECRET[len("whsec_"):])
        self.conn: http.client.HTTPConnection | None = None

    def send(self, event_id: str, order: int) -> tuple[int, float, dict]:
        body = json.dumps({"id": event_id, "type": "payment.succeeded",
                           "data": {"payment_id": f"pay_{order}", "amount": 4200, "currency": "gbp"}},
                          separators=(",", ":")).encode()
        ts = str(int(time.time()))
        mac = hmac.new(self.key, f"{event_id}.{ts}.".encode() + body, hashlib.sha256).digest()
        headers = {"content-type": "application/json", "webhook-id": event_id, "webhook-timestamp": ts,
                   "webhook-signature": "v1," + base64.b64encode(mac).decode()}
        for attempt in range(2):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection(self.host, self.port, timeout=15)
                self.conn.request("POST", "/webhooks/payments", body=body, headers=headers)
                r = self.conn.getresponse()
                data = r.read()
                accepted_ms = time.time() * 1000.0
                try:
                    parsed = json.loads(data)
                except ValueError:
                    parsed = {}
                return r.status, accepted_ms, parsed
            except (OSError, http.client.HTTPException):
                if self.conn:
                    self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn:
            self.conn.close()


def send_paced(sender: Sender, prefix: str, order0: int, count: int, rate: float,
               stop_at: float | None = None) -> list[tuple[int, float]]:
    """Sends `count` events one by one at `rate`/s to orders order0+1.. ; returns
    (order, accepted unix ms) of those answered 200 `processed`."""
    sent: list[tuple[int, float]] = []
    start = time.monotonic()
    for i in range(count):
        due = start + i / rate
        if stop_at is not None and due >= stop_at:
            break
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        order = order0 + i + 1
        status, accepted_ms, body = sender.send(f"evt_{prefix}_{i + 1}", order)
        if status == 200 and body.get("status") == "processed":
            sent.append((order, accepted_ms))
        else:
            log(f"  e2e: event for order {order} answered {status} {body}")
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


# --------------------------------------------------------------------------
# What the database was doing during a run, for the prune phase's figures.


class WaitSampler:
    """Samples pg_stat_activity every `interval` s from one session in a thread:
    per application (the ingest, the prune, autovacuum), how often a backend was
    active and on what it waited ("CPU" when on nothing)."""

    SQL = (f"SELECT CASE WHEN backend_type = 'autovacuum worker' THEN 'autovacuum' ELSE application_name END, "
           f"coalesce(wait_event_type || ':' || wait_event, 'CPU'), count(*) FROM pg_stat_activity "
           f"WHERE datname = current_database() AND pid <> pg_backend_pid() AND (backend_type = 'autovacuum worker' "
           f"OR (state = 'active' AND application_name IN ('webhook-ingest', 'outbox-relay-prune'))) "
           f"GROUP BY 1, 2;")

    def __init__(self, db: Db, name: str, interval: float = 0.2) -> None:
        self.session = Session(db, name)
        self.interval = interval
        self.samples = 0
        self.counts: dict[str, dict[str, int]] = {}
        self.error: str | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        try:
            while not self.done.is_set():
                for row in self.session.query(self.SQL, timeout=30):
                    app, wait, n = row.split("|")
                    waits = self.counts.setdefault(app, {})
                    waits[wait] = waits.get(wait, 0) + int(n)
                self.samples += 1
                self.done.wait(self.interval)
        except BenchError as e:
            self.error = str(e)

    def stop(self) -> dict:
        """Per application: active backends on average, and the top waits as
        shares of the active samples."""
        self.done.set()
        self.thread.join(timeout=35)
        self.session.close()
        out: dict = {"samples": self.samples}
        for app, waits in sorted(self.counts.items()):
            total = sum(waits.values())
            top = sorted(waits.items(), key=lambda kv: -kv[1])[:6]
            out[app] = {"active_avg": round(total / max(self.samples, 1), 2),
                        "waits_pct": {w: round(100 * n / total, 1) for w, n in top}}
        if self.error:
            out["error"] = self.error
        return out


# --------------------------------------------------------------------------
# A trivial OTLP/HTTP sink for the tracing overhead run.


class OtlpSink:
    def __init__(self) -> None:
        sink = self
        self.requests = 0
        self.bytes = 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("content-length") or 0)
                if n:
                    self.rfile.read(n)
                sink.requests += 1
                sink.bytes += n
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --------------------------------------------------------------------------
# The machine.


def machine(db: Db) -> dict:
    settings = {}
    for row in db.sql(Product.DB, """
SELECT name, current_setting(name) FROM pg_settings
 WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'wal_sync_method', 'shared_buffers',
                'max_wal_size', 'checkpoint_timeout', 'wal_level', 'max_connections', 'autovacuum',
                'work_mem', 'effective_io_concurrency', 'wal_compression', 'commit_delay', 'jit')
 ORDER BY name;
SELECT 'server_version', current_setting('server_version');
SELECT 'ssl_in_use', coalesce((SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()), 'false');
"""):
        k, _, v = row.partition("|")
        settings[k] = v
    mem = 0
    model = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) // 1024
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip() != ""
    except (OSError, subprocess.TimeoutExpired):
        commit, dirty = "", False
    host = re.sub(r"^[a-z]+://([^@]*@)?", "", db.base)
    return {
        "cores": os.cpu_count(),
        "cpu_model": model,
        "memory_mib": mem,
        "kernel": platform.release(),
        "load_average_at_start": [round(x, 2) for x in LOAD0],
        "postgres_version": settings.pop("server_version", ""),
        "postgres_host": host,
        "postgres_settings": settings,
        "commit": commit + ("-dirty" if dirty else ""),
        "caller_product_variables_ignored": sorted(k for k in os.environ if PRODUCT_VARS.match(k)),
    }


# --------------------------------------------------------------------------
# The phases.


class Bench:
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

    def phase(self, name: str, fn) -> None:
        if ONLY and name != "setup" and name not in ONLY:
            return
        t = time.monotonic()
        log(f"phase {name} ...")
        try:
            fn()
        except BenchError as e:
            self.errors[name] = str(e)
            log(f"phase {name} FAILED: {e}")
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError,
                ZeroDivisionError, json.JSONDecodeError) as e:
            # A bug or a surprise: the other phases still run, the trace goes to the logs.
            with open(LOGS / "bench-errors.log", "a") as f:
                f.write(f"--- phase {name}\n{traceback.format_exc()}\n")
            self.errors[name] = f"{type(e).__name__}: {e} (traceback in {LOGS / 'bench-errors.log'})"
            log(f"phase {name} FAILED: {self.errors[name]}")
        self.phases[name] = round(time.monotonic() - t, 1)
        log(f"phase {name} done in {self.phases[name]:.1f}s")

    # 1. setup ---------------------------------------------------------------
    def setup(self) -> None:
        for name in ("webhook-ingest", "outbox-relay", "simulator"):
            if not os.access(BIN / name, os.X_OK):
                raise BenchError(f"{BIN / name} is missing: run `make release` first (make bench does)")
        for tool in ("psql", "pgbench", "node", "npm"):
            if not shutil.which(tool):
                raise BenchError(f"`{tool}` is not on PATH; the bench needs it")
        for f in ("schema.sql", "reference-ingest.sql", "reference-ingest-one-statement.sql", "peer/peer.js"):
            if not (BENCH_REFERENCES / f).exists():
                raise BenchError(f"{BENCH_REFERENCES / f} is missing")
        # The three databases, the peer's dependencies: in parallel, nothing is measured yet.
        peer = threading.Thread(target=self.prepare_peer, daemon=True)
        peer.start()
        ref_err: list[Exception] = []

        def make_ref() -> None:
            try:
                self.ref.create()
            except Exception as e:  # noqa: BLE001
                ref_err.append(e)

        ref = threading.Thread(target=make_ref, daemon=True)
        ref.start()
        self.product.create()
        self.db.recreate("bench_peer")
        self.services.start_downstream()
        ref.join(timeout=400)
        peer.join(timeout=300)
        if ref.is_alive():
            raise BenchError("loading the reference schema took over 400s")
        if ref_err:
            raise BenchError(f"reference database: {ref_err[0]}")
        if self.peer_error:
            self.errors["peer_setup"] = self.peer_error
        self.report["machine"] = machine(self.db)
        m = self.report["machine"]
        s = m["postgres_settings"]
        log(f"machine: {m['cores']} cores, {m['memory_mib']} MiB, {m['kernel']}, PostgreSQL "
            f"{m['postgres_version']}, fsync={s.get('fsync')} synchronous_commit={s.get('synchronous_commit')} "
            f"full_page_writes={s.get('full_page_writes')} shared_buffers={s.get('shared_buffers')}, "
            f"load {m['load_average_at_start']}")

    peer_error: str | None = None

    def prepare_peer(self) -> None:
        dst = OUT / "peer"
        try:
            dst.mkdir(parents=True, exist_ok=True)
            for f in ("package.json", "peer.js"):
                target = dst / f
                if target.exists():
                    target.chmod(0o644)
                shutil.copyfile(BENCH_REFERENCES / "peer" / f, target)
            if (dst / "node_modules" / "graphile-worker").is_dir():
                return
            log("  peer: installing graphile-worker (npm, once)")
            rc, out, err = run_cmd("npm ci", ["npm", "ci", "--no-audit", "--no-fund"], timeout=240, cwd=dst,
                                   env=clean_env(), check=False)
            if rc != 0:
                run_cmd("npm install", ["npm", "install", "--no-audit", "--no-fund"], timeout=240, cwd=dst,
                        env=clean_env())
        except (BenchError, OSError) as e:
            self.peer_error = f"preparing the peer: {e}"

    # 2. ingest --------------------------------------------------------------
    def ingest_phase(self) -> None:
        secs = CFG["ingest_secs"]
        self.ingest = self.services.start_ingest("main")
        runs: dict = {}
        for c in CONCURRENCIES:
            self.product.reset(CFG["product_history"])
            analyzes0 = self.outbox_analyzes()
            ours = summary_brief(provider_run(self.ingest.url, f"c{c}", self.ingest, concurrency=c, secs=secs))
            # An autoanalyze of the outbox during the run re-plans the ingest's statement.
            ours["outbox_autoanalyzes"] = self.outbox_analyzes() - analyzes0
            # No relay runs here (the references do not drain either): the
            # outbox's pending rows grow through the run.
            ours["outbox_pending_after"] = int(self.db.one(
                Product.DB, "SELECT count(*) FROM outbox WHERE status = 'pending'"))
            ref_runs = {}
            for name, file in (("reference", "reference-ingest.sql"),
                               ("one_statement", "reference-ingest-one-statement.sql")):
                self.ref.reset()
                ref_runs[name] = pgbench(self.db, BENCH_REFERENCES / file, c, secs, f"{name}-c{c}")
            runs[c] = {"ours": ours, **ref_runs}
            log(f"  c{c:<3} ours {ours['requests_per_s']:>8,.0f} req/s  p50 {ours['p50_ms']} p99 {ours['p99_ms']} ms"
                f" ({ours['outbox_pending_after']:,} pending outbox rows at the end, "
                f"{ours['outbox_autoanalyzes']} autoanalyze)"
                f" | reference {ref_runs['reference']['tps']:>8,.0f} tps | one statement "
                f"{ref_runs['one_statement']['tps']:>8,.0f} tps"
                + (f"  PROBLEMS {ours['problems']}" if ours.get("problems") else ""))
            r = self.report
            r[f"ingest_rps_c{c}"] = ours["requests_per_s"]
            r[f"ingest_p50_ms_c{c}"] = ours["p50_ms"]
            r[f"ingest_p99_ms_c{c}"] = ours["p99_ms"]
            r[f"ingest_new_events_per_s_c{c}"] = ours["new_events_per_s"]
            r[f"reference_tps_c{c}"] = ref_runs["reference"]["tps"]
            r[f"reference_p50_ms_c{c}"] = ref_runs["reference"]["p50_ms"]
            r[f"reference_p99_ms_c{c}"] = ref_runs["reference"]["p99_ms"]
            r[f"one_statement_tps_c{c}"] = ref_runs["one_statement"]["tps"]
            r[f"one_statement_p50_ms_c{c}"] = ref_runs["one_statement"]["p50_ms"]
            r[f"one_statement_p99_ms_c{c}"] = ref_runs["one_statement"]["p99_ms"]
            r[f"ingest_vs_reference_c{c}"] = ratio(ours["requests_per_s"], ref_runs["reference"]["tps"])
            r[f"ingest_vs_one_statement_c{c}"] = ratio(ours["requests_per_s"], ref_runs["one_statement"]["tps"])
        self.details["ingest"] = runs
        # Memory after the closed-loop runs alone (the open-loop phases next may overload it).
        self.report["ingest_rss_mib_closed_loop"] = self.ingest.rss().get("peak_mib")

    def outbox_analyzes(self) -> int:
        return int(self.db.one(Product.DB, "SELECT autoanalyze_count FROM pg_stat_user_tables "
                                           "WHERE relname = 'outbox'") or 0)

    def peak_rps(self) -> float:
        peaks = [self.report.get(f"ingest_rps_c{c}") or 0 for c in CONCURRENCIES]
        if not max(peaks) and os.environ.get("BENCH_PEAK_RPS"):
            return float(os.environ["BENCH_PEAK_RPS"])
        if not max(peaks):
            raise BenchError("no ingest peak measured")
        return max(peaks)

    # 3. half load -------------------------------------------------------------
    def half_load_phase(self) -> None:
        if not self.ingest:
            raise BenchError("the ingest is not running")
        peak = self.peak_rps()
        # --rate is events/s; 10% of events are delivered twice.
        rate = peak / 2 / (1 + DUPLICATE_RATE)
        self.product.reset(CFG["product_history"])
        s = summary_brief(provider_run(self.ingest.url, "half", self.ingest, rate=rate, secs=CFG["half_secs"]))
        s["target_requests_per_s"] = round(peak / 2, 1)
        s["events_rate"] = round(rate, 1)
        self.details["half_load"] = s
        self.report["ingest_p99_ms_half_load"] = s["p99_ms"]
        self.report["ingest_p50_ms_half_load"] = s["p50_ms"]
        self.report["half_load_rps"] = s["requests_per_s"]
        self.report["half_load_status_counts"] = s.get("status_counts")
        log(f"  half load {s['requests_per_s']:,.0f} req/s (target {peak / 2:,.0f}): p50 {s['p50_ms']} "
            f"p99 {s['p99_ms']} p99.9 {s['p999_ms']} ms")

    # 4. relay -----------------------------------------------------------------
    def drain(self, session: Session, relays: list[Service], n: int, tag: str, rows: int | None = None) -> dict:
        rows = rows or CFG["relay_rows"]
        first = DRAIN_ORDER0 + n * 1_000_000
        self.services.reset_downstream()
        maint0 = self.outbox_maintenance(session)
        session.query("BEGIN;\n" + drain_rows_sql(first, rows) + ";\nNOTIFY outbox_pending;", timeout=120)
        cpu0 = [r.cpu() or 0 for r in relays]
        meter = CpuMeter()
        marker = session.send("COMMIT;")
        t0 = time.monotonic()  # the rows become visible with this commit
        session.wait(marker, timeout=60)
        deadline = t0 + 300
        effects = 0
        # Cheap polling: the simulator's counters (no database load) until
        # every row had its effect, then the database until none is pending.
        while time.monotonic() < deadline:
            effects = self.services.stats()["effects"]
            if effects >= rows:
                break
            time.sleep(0.02)
        t_effects = time.monotonic() - t0
        pending = -1
        while time.monotonic() < deadline:
            pending = int(session.query("SELECT count(*) FROM outbox WHERE status = 'pending';")[0])
            if pending == 0:
                break
            time.sleep(0.005)
        secs = time.monotonic() - t0
        if pending != 0:
            raise BenchError(f"drain {tag}: {pending} rows still pending after {secs:.0f}s "
                             f"({effects} effects downstream)")
        st = self.services.stats()
        relay_cpu = sum((r.cpu() or 0) - c0 for r, c0 in zip(relays, cpu0))
        maint1 = self.outbox_maintenance(session)
        out = {"rows": rows, "relays": len(relays), "seconds": round(secs, 3),
               "rows_per_s": round(rows / secs, 1), "seconds_to_last_effect": round(t_effects, 3),
               "downstream_requests": st["requests"], "downstream_effects": st["effects"],
               "double_effects": st["double_effects"], "relay_cpu_secs": round(relay_cpu, 2),
               "machine_cores_busy": meter.cores_busy(),
               # Autovacuum and autoanalyze of the outbox during the drain: a
               # new ANALYZE re-plans the relay's prepared statements.
               "outbox_autovacuums": maint1["autovacuum_count"] - maint0["autovacuum_count"],
               "outbox_autoanalyzes": maint1["autoanalyze_count"] - maint0["autoanalyze_count"],
               "outbox_dead_tuples_after": maint1["n_dead_tup"]}
        log(f"  drain {tag}: {rows:,} rows in {secs:.2f}s = {out['rows_per_s']:,.0f} rows/s "
            f"({len(relays)} relay{'s' if len(relays) > 1 else ''}, relay cpu {relay_cpu:.1f}s, "
            f"{st['requests']:,} requests, {st['double_effects']} double effects, outbox autovacuum "
            f"{out['outbox_autovacuums']} autoanalyze {out['outbox_autoanalyzes']})")
        return out

    @staticmethod
    def outbox_maintenance(session: Session) -> dict:
        row = session.query("SELECT autovacuum_count, autoanalyze_count, n_dead_tup FROM pg_stat_user_tables "
                            "WHERE relname = 'outbox';")[0].split("|")
        return {"autovacuum_count": int(row[0]), "autoanalyze_count": int(row[1]), "n_dead_tup": int(row[2])}

    def relay_phase(self) -> None:
        # Outbox with its done history only; vacuumed once, before the first drain.
        self.product.reset(CFG["product_history"])
        relay = self.services.start_relay("a")
        self.relays.append(relay)
        session = Session(self.db, Product.DB)
        try:
            drains = []
            for i in range(3):
                drains.append(self.drain(session, [relay], i, f"{i + 1}/3 (one relay)"))
            # Two relays start from the state the first drain did (vacuumed).
            session.query("VACUUM ANALYZE outbox; CHECKPOINT;", timeout=300)
            relay_b = self.services.start_relay("b")
            self.relays.append(relay_b)
            two = self.drain(session, [relay, relay_b], 3, "two relays")
            self.rss["relay_b"] = relay_b.rss()
            relay_b.stop()
        finally:
            session.close()
        with_relay = None
        if self.ingest:
            # The ingest at 64 senders again, now with a relay draining what it
            # enqueues (as deployed): the outbox's pending set stays small.
            self.product.reset(CFG["product_history"])
            self.services.reset_downstream()
            with_relay = summary_brief(provider_run(self.ingest.url, "c64-with-relay", self.ingest,
                                                    concurrency=64, secs=CFG["trace_secs"]))
            with_relay["outbox_pending_after"] = int(self.db.one(
                Product.DB, "SELECT count(*) FROM outbox WHERE status = 'pending'"))
            with_relay["downstream_effects"] = self.services.stats()["effects"]
            self.report["ingest_rps_c64_with_relay"] = with_relay["requests_per_s"]
            self.report["ingest_p99_ms_c64_with_relay"] = with_relay["p99_ms"]
            log(f"  c64 with a relay draining: {with_relay['requests_per_s']:,.0f} req/s, p50 {with_relay['p50_ms']} "
                f"p99 {with_relay['p99_ms']} ms ({with_relay['outbox_pending_after']:,} pending at the end)")
        rates = [d["rows_per_s"] for d in drains]
        self.details["relay"] = {"drains_one_relay": drains, "two_relays": two, "ingest_c64_with_relay": with_relay,
                                 "note": "three back-to-back drains, no VACUUM between them; "
                                         "then VACUUM, then the two-relay drain"}
        r = self.report
        r["relay_rows_per_s_1"] = rates[0]
        r["relay_rows_per_s_2"] = two["rows_per_s"]
        r["relay_drain_rows_per_s"] = rates
        r["relay_decay_ratio"] = round(min(rates) / max(rates), 3)

    # 5. peer ------------------------------------------------------------------
    def peer_phase(self) -> None:
        if self.peer_error:
            raise BenchError(self.peer_error)
        jobs = CFG["peer_jobs"]
        meter = CpuMeter()
        _, out, err = run_cmd("peer", ["node", "peer.js", "--jobs", jobs, "--concurrency", 24], timeout=300,
                              cwd=OUT / "peer", env=clean_env({"DATABASE_URL": self.db.url("bench_peer")}))
        (LOGS / "peer.log").write_text(out + err)
        res = parse_summary(out, "peer")
        res["machine_cores_busy"] = meter.cores_busy()
        self.details["peer"] = res
        self.report["peer_jobs_per_s"] = res["jobs_per_s"]
        self.report["relay_vs_peer"] = ratio(self.report.get("relay_rows_per_s_1"), res["jobs_per_s"])
        log(f"  peer (graphile-worker {res.get('version')}): {jobs:,} jobs in {res['seconds']}s = "
            f"{res['jobs_per_s']:,} jobs/s")

    # 6. end to end ------------------------------------------------------------
    def e2e_phase(self) -> None:
        if not self.ingest or not self.relays:
            raise BenchError("needs the ingest and a relay running")
        self.product.reset(CFG["product_history"])
        self.services.reset_downstream()
        sender = Sender(self.ingest.url)
        try:
            n = CFG["e2e_idle_events"]
            sent = send_paced(sender, run_id("idle"), E2E_IDLE_ORDER0, n, E2E_RATE)
            idle = e2e_latencies(self.services, sent, timeout=60)
            log(f"  e2e idle ({n} events at {E2E_RATE:g}/s): p50 {idle['p50_ms']} p99 {idle['p99_ms']} "
                f"max {idle['max_ms']} ms")
            # Under load: a provider at half of peak; our events in the middle of it.
            self.services.reset_downstream()
            peak = self.peak_rps()
            rate = peak / 2 / (1 + DUPLICATE_RATE)
            secs = CFG["e2e_load_secs"]
            box: dict = {}

            def load() -> None:
                try:
                    box["s"] = provider_run(self.ingest.url, "e2e-load", self.ingest, rate=rate, secs=secs,
                                            orders=900_000)
                except BenchError as e:
                    box["error"] = str(e)

            t = threading.Thread(target=load, daemon=True)
            t.start()
            time.sleep(1.0)
            stop_at = time.monotonic() + secs - 1.5
            sent = send_paced(sender, run_id("load"), E2E_LOAD_ORDER0, int(secs * E2E_RATE), E2E_RATE,
                              stop_at=stop_at)
            t.join(timeout=secs + 150)
            if "error" in box:
                raise BenchError(box["error"])
            loaded = e2e_latencies(self.services, sent, timeout=120)
            st = self.services.stats()
            s = summary_brief(box["s"]) if "s" in box else {}
        finally:
            sender.close()
        self.details["e2e"] = {"idle": idle, "load": loaded, "load_provider": s,
                               "load_downstream_effects": st["effects"], "double_effects": st["double_effects"]}
        r = self.report
        r["e2e_p50_ms_idle"], r["e2e_p99_ms_idle"] = idle["p50_ms"], idle["p99_ms"]
        r["e2e_p50_ms_load"], r["e2e_p99_ms_load"] = loaded["p50_ms"], loaded["p99_ms"]
        r["ingest_p99_ms_half_load_with_relay"] = s.get("p99_ms")
        log(f"  e2e under load ({s.get('requests_per_s', 0):,.0f} req/s, relay draining): p50 "
            f"{loaded['p50_ms']} p99 {loaded['p99_ms']} max {loaded['max_ms']} ms; ingest p99 {s.get('p99_ms')} ms")

    # memory, measured after every load phase -----------------------------------
    def record_rss(self) -> None:
        if self.ingest:
            self.rss["ingest"] = self.ingest.rss()
        for i, relay in enumerate(self.relays):
            if relay.p.poll() is None:
                self.rss[f"relay_{relay.tag}"] = relay.rss()
        r = self.report
        r["ingest_rss_mib"] = (self.rss.get("ingest") or {}).get("peak_mib")
        peaks = [v.get("peak_mib") for k, v in self.rss.items() if k.startswith("relay") and v.get("peak_mib")]
        r["relay_rss_mib"] = max(peaks) if peaks else None
        self.details["rss"] = self.rss

    # 7. tracing -----------------------------------------------------------------
    def tracing_phase(self) -> None:
        if not self.ingest:
            raise BenchError("the ingest is not running")
        for relay in self.relays:
            if relay.p.poll() is None:
                relay.stop()
        secs = CFG["trace_secs"]
        self.product.reset(CFG["product_history"])
        plain = summary_brief(provider_run(self.ingest.url, "untraced", self.ingest, concurrency=64, secs=secs))
        self.ingest.stop()
        self.ingest = None
        sink = OtlpSink()
        try:
            traced_ingest = self.services.start_ingest("traced", {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url})
            try:
                self.product.reset(CFG["product_history"])
                traced = summary_brief(provider_run(traced_ingest.url, "traced", traced_ingest, concurrency=64,
                                                    secs=secs))
                time.sleep(1)
                self.rss["ingest_traced"] = traced_ingest.rss()
            finally:
                traced_ingest.stop()
            exported = {"requests": sink.requests, "bytes": sink.bytes}
        finally:
            sink.close()
        overhead = round((1 - traced["requests_per_s"] / plain["requests_per_s"]) * 100, 1)
        self.details["tracing"] = {"untraced": plain, "traced": traced, "otlp_sink": exported}
        self.report["tracing_overhead_pct"] = overhead
        self.report["ingest_rps_c64_traced"] = traced["requests_per_s"]
        log(f"  tracing: {plain['requests_per_s']:,.0f} -> {traced['requests_per_s']:,.0f} req/s "
            f"({overhead}% overhead), p99 {plain['p99_ms']} -> {traced['p99_ms']} ms, sink got "
            f"{exported['requests']} exports ({exported['bytes'] / 1e6:.1f} MB)")
        if exported["requests"] == 0:
            self.errors["tracing"] = "the OTLP sink received nothing: was anything exported?"

    # 7b. the relay's log line -----------------------------------------------------
    def relay_log_phase(self) -> None:
        for relay in self.relays:
            if relay.p.poll() is None:
                relay.stop()
        self.product.reset(CFG["product_history"])
        rows = CFG["log_line_rows"]
        rates: dict = {"on": [], "off": []}
        cpu: dict = {"on": [], "off": []}
        lines: dict = {"on": [], "off": []}
        session = Session(self.db, Product.DB)
        try:
            # On, off, off, on: a trend across the drains (dead tuples, a warm
            # cache) weighs on both sides alike. Drains 4..7: their own keys.
            for i, mode in enumerate(("on", "off", "off", "on")):
                tag = f"log-{mode}-{i}"
                (LOGS / f"relay-{tag}.log").unlink(missing_ok=True)  # its lines are counted below
                relay = self.services.start_relay(tag, {"RUST_LOG": "warn"} if mode == "off" else None)
                try:
                    d = self.drain(session, [relay], 4 + i, f"log line {mode}", rows=rows)
                finally:
                    relay.stop()
                rates[mode].append(d["rows_per_s"])
                cpu[mode].append(d["relay_cpu_secs"])
                text = (LOGS / f"relay-{tag}.log").read_text(errors="replace")
                lines[mode].append(text.count('"message":"downstream call finished"'))
        finally:
            session.close()
        on, off = statistics.mean(rates["on"]), statistics.mean(rates["off"])
        self.details["relay_log"] = {"rows": rows, "rows_per_s": rates, "relay_cpu_secs": cpu, "call_lines": lines,
                                     "note": "one relay per drain; on = RUST_LOG unset (the default), "
                                             "off = RUST_LOG=warn; drains in the order on, off, off, on"}
        r = self.report
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
            self.errors["relay_log"] = (f"expected one call line per row with the line on ({rows}), none off: "
                                        f"on {lines['on']}, off {lines['off']}")

    # 8. prune ------------------------------------------------------------------
    def prune_phase(self) -> None:
        """Retention under load: old done outbox rows and processed events, then
        the ingest at half of peak (open loop) for a baseline window, then at the
        same rate while `outbox-relay prune` deletes them (1,000 rows per
        statement); that window's load stops when the prune ends."""
        peak = self.peak_rps()
        rate = peak / 2 / (1 + DUPLICATE_RATE)
        outbox_rows, events = CFG["prune_outbox_rows"], CFG["prune_events"]
        for relay in self.relays:
            if relay.p.poll() is None:
                relay.stop()  # a relay prunes on its own too
        self.product.reset(CFG["product_history"])
        # The rows to prune, as the growth phase makes its history (indexes
        # dropped and re-created), PRUNE_AGE_DAYS days older than the history.
        gen_outbox = self.generate(
            "outbox", lambda a, b, total: history_outbox_sql(a, b, total, order0=PRUNE_ORDER0,
                                                             days_ago=PRUNE_AGE_DAYS),
            1, outbox_rows // 2, outbox_rows // 2)
        gen_events = self.generate(
            "processed_events", lambda a, b, total: history_events_sql(a, b, total, seed="old", order0=PRUNE_ORDER0,
                                                                       days_ago=PRUNE_AGE_DAYS),
            1, events, events)
        t_vac = time.monotonic()
        self.db.sql(Product.DB, "VACUUM ANALYZE outbox; VACUUM ANALYZE processed_events; CHECKPOINT;", timeout=900)
        vac = round(time.monotonic() - t_vac, 1)
        old = self.prunable()
        if old != (outbox_rows, events):
            raise BenchError(f"expected {outbox_rows:,} outbox rows and {events:,} events past the retention, "
                             f"found {old[0]:,} and {old[1]:,}")
        size = self.db.one(Product.DB, "SELECT pg_size_pretty(pg_total_relation_size('processed_events')) "
                                       "|| ' / ' || pg_size_pretty(pg_total_relation_size('outbox'))")
        log(f"  {outbox_rows:,} done outbox rows and {events:,} processed events {PRUNE_AGE_DAYS} days old "
            f"beside {CFG['product_history']:,} recent ones ({size}): generated in {gen_outbox}s + {gen_events}s, "
            f"vacuum and checkpoint {vac}s")
        pruned: dict = {}

        def prune() -> None:
            time.sleep(0.5)  # the provider's connections up first, as in the baseline
            t0 = time.monotonic()
            _, out, err = run_cmd("outbox-relay prune", [BIN / "outbox-relay", "prune"],
                                  timeout=CFG["prune_timeout_secs"],
                                  env=clean_env({"DATABASE_URL": self.db.url(Product.DB),
                                                 "RETENTION_DAYS": str(RETENTION_DAYS)}))
            pruned["secs"] = round(time.monotonic() - t0, 2)
            (LOGS / "prune.log").write_text(out + err)
            m = re.search(r"pruned (\d+) outbox row\(s\) and (\d+) processed event\(s\)", out)
            if not m:
                raise BenchError(f"outbox-relay prune: unexpected output {(out + err).strip()[-300:]!r}")
            pruned["outbox_rows"], pruned["processed_events"] = int(m.group(1)), int(m.group(2))

        ingest = self.services.start_ingest("prune")
        try:
            # A new ingest's first seconds (connections, plans) are not what is measured.
            provider_run(ingest.url, "prune-warmup", ingest, rate=rate, secs=2.0)
            self.undo_run()
            base = self.prune_window(ingest, "prune-baseline", rate, CFG["half_secs"])
            log(f"  baseline {base['requests_per_s']:,.0f} req/s (target {peak / 2:,.0f}): p50 {base['p50_ms']} "
                f"p99 {base['p99_ms']} p99.9 {base['p999_ms']} max {base['max_ms']} ms")
            self.undo_run()
            during = self.prune_window(ingest, "prune-during", rate, CFG["prune_timeout_secs"] + 30, prune)
        finally:
            ingest.stop()
        rows = pruned["outbox_rows"] + pruned["processed_events"]
        left = self.prunable()
        rows_per_s = round(rows / pruned["secs"]) if pruned["secs"] else None
        log(f"  during the prune {during['requests_per_s']:,.0f} req/s: p50 {during['p50_ms']} p99 {during['p99_ms']} "
            f"p99.9 {during['p999_ms']} max {during['max_ms']} ms; prune deleted {pruned['outbox_rows']:,} outbox "
            f"rows and {pruned['processed_events']:,} events in {pruned['secs']}s = {rows_per_s:,} rows/s "
            f"({left[0] + left[1]:,} past the retention left)")
        for tag, w in (("baseline", base), ("during", during)):
            d = w["database"]
            log(f"    {tag}: WAL {d['wal_mb']} MB, {d['checkpoints']} checkpoint(s), {d['buffers_backend']} buffers "
                f"written by backends, outbox/events autovacuum {d['autovacuums']}, ingest waits "
                f"{w['waits'].get('webhook-ingest', {}).get('waits_pct')}")
        if (pruned["outbox_rows"], pruned["processed_events"]) != (outbox_rows, events) or left != (0, 0):
            self.errors["prune_rows"] = (f"prune deleted {pruned['outbox_rows']:,} outbox rows and "
                                         f"{pruned['processed_events']:,} events of {outbox_rows:,} and {events:,}; "
                                         f"{left[0] + left[1]:,} left past the retention")
        self.details["prune"] = {"old_outbox_rows": outbox_rows, "old_events": events,
                                 "recent_history": CFG["product_history"], "generate_outbox_secs": gen_outbox,
                                 "generate_events_secs": gen_events, "vacuum_secs": vac, "sizes_before": size,
                                 "prune": pruned, "baseline": base, "during": during}
        r = self.report
        r["ingest_p99_ms_baseline_prune"] = base["p99_ms"]
        r["ingest_p99_ms_during_prune"] = during["p99_ms"]
        r["ingest_p50_ms_baseline_prune"] = base["p50_ms"]
        r["ingest_p50_ms_during_prune"] = during["p50_ms"]
        r["prune_load_rps"] = during["requests_per_s"]
        r["prune_rows"] = rows
        r["prune_secs"] = pruned["secs"]
        r["prune_rows_per_s"] = rows_per_s
        r["prune_note"] = (f"{CFG['mode']} mode: the prune deleted {outbox_rows:,} done outbox rows and "
                           f"{events:,} processed events, {PRUNE_AGE_DAYS} days old (RETENTION_DAYS="
                           f"{RETENTION_DAYS}), beside {CFG['product_history']:,} recent ones")

    def undo_run(self) -> None:
        """Every order pending again (a provider run pays orders 1, 2, ..: the
        next would find them paid) and no pending outbox row; the run's
        processed events stay (recent, new ids). Vacuumed, checkpointed."""
        self.db.sql(Product.DB, """
DELETE FROM outbox WHERE status = 'pending';
UPDATE orders SET status = 'pending', updated_at = now() WHERE status <> 'pending';
VACUUM ANALYZE orders; VACUUM ANALYZE outbox; VACUUM ANALYZE processed_events; CHECKPOINT;""", timeout=600)

    def prunable(self) -> tuple[int, int]:
        """Outbox rows and processed events past the retention (what prune deletes)."""
        row = self.db.one(Product.DB, f"""
SELECT (SELECT count(*) FROM outbox WHERE status IN ('done', 'cancelled')
           AND finished_at < now() - interval '{RETENTION_DAYS} days')
       || '|' || (SELECT count(*) FROM processed_events WHERE processed_at < now() - interval '{RETENTION_DAYS} days')
""", timeout=300)
        a, b = row.split("|")
        return int(a), int(b)

    def db_counters(self) -> dict:
        """WAL position, checkpoints and backends' own buffer writes (pg_stat_bgwriter
        before PostgreSQL 17; None where a column moved), outbox and events autovacuums."""
        row = self.db.one(Product.DB, """
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint || '|' || (SELECT to_jsonb(b) FROM pg_stat_bgwriter b)
       || '|' || (SELECT sum(autovacuum_count) FROM pg_stat_user_tables
                   WHERE relname IN ('outbox', 'processed_events'))""")
        wal, bgw, av = row.split("|")
        b = json.loads(bgw)
        ckpt = (b["checkpoints_timed"] + b["checkpoints_req"]) if "checkpoints_req" in b else None
        return {"wal": int(wal), "checkpoints": ckpt, "buffers_backend": b.get("buffers_backend"),
                "autovacuums": int(av)}

    def prune_window(self, ingest: Service, tag: str, rate: float, secs: float, during=None) -> dict:
        """One open-loop provider run at `rate` events/s, for `secs` or until
        `during` returns; with what the database did meanwhile."""
        c0 = self.db_counters()
        sampler = WaitSampler(self.db, Product.DB)
        try:
            s = summary_brief(provider_run(ingest.url, tag, ingest, during=during, rate=rate, secs=secs))
        finally:
            waits = sampler.stop()
        c1 = self.db_counters()

        def diff(k: str):
            return None if c0[k] is None or c1[k] is None else c1[k] - c0[k]

        s["events_rate"] = round(rate, 1)
        s["database"] = {"wal_mb": round(diff("wal") / 1e6, 1), "checkpoints": diff("checkpoints"),
                         "buffers_backend": diff("buffers_backend"), "autovacuums": diff("autovacuums")}
        s["waits"] = waits
        return s

    # 9. growth ------------------------------------------------------------------
    def claim_sql(self) -> str:
        """The relay's claim statement, read from its source so the bench times
        what the relay runs: `const CLAIM: &str = "..."`, `Sql::new("...", ..)`
        or `include_str!("...")`."""
        path = ROOT / "crates" / "outbox-relay" / "src" / "storage.rs"
        src = path.read_text()
        m = re.search(r'const CLAIM\b[^=]*=\s*(?:[A-Za-z_:]+\(\s*)?(?:r#)?"(.*?)"#?\s*[,;)]', src, re.S)
        if m and "include_str!" not in src[m.start():m.start(1)]:
            return m.group(1).strip()
        m = re.search(r'const CLAIM\b[^=]*=[^;]*?include_str!\(\s*"([^"]+)"\s*\)', src, re.S)
        if m:
            return (path.parent / m.group(1)).read_text().strip().rstrip(";")
        raise BenchError(f"could not find the CLAIM statement in {path}")

    def time_claim(self, label: str) -> dict:
        """The relay's claim as the relay runs it (a prepared statement, batch 50),
        12 times, each rolled back; median of the last 7 (generic plan by then)."""
        claim = self.claim_sql()
        # batch size, lease owner, lease in ms, RELAY_MAX_ATTEMPTS
        parts = [f"PREPARE bench_claim(int8, text, int8, int4) AS {claim};"]
        for _ in range(12):
            parts.append("BEGIN; EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_claim(50, 'bench-claim', 60000, 25); "
                         "ROLLBACK;")
        parts.append("SELECT 'pending=' || count(*) FROM outbox WHERE status = 'pending';")
        parts.append("SELECT 'done=' || count(*) FROM outbox WHERE status = 'done';")
        out = self.db.sql(Product.DB, "\n".join(parts), timeout=300)
        times = [float(x) for x in re.findall(r"Execution Time: ([\d.]+) ms", "\n".join(out))]
        plans, cur = [], []
        for line in out:
            cur.append(line)
            if line.startswith("Execution Time"):
                plans.append(cur)
                cur = []
        counts = dict(x.split("=", 1) for x in out if re.match(r"^(pending|done)=\d+$", x))
        res = {"median_ms": round(statistics.median(times[-7:]), 3) if times else None,
               "all_ms": times, "pending_rows": int(counts.get("pending", -1)),
               "done_rows": int(counts.get("done", -1)), "plan": plans[-1] if plans else []}
        log(f"  claim ({label}): {res['median_ms']} ms with {res['pending_rows']:,} pending and "
            f"{res['done_rows']:,} done rows")
        return res

    def generate(self, table: str, sql_for, first: int, last: int, total: int) -> float:
        """Bulk history: indexes dropped, rows inserted by two sessions in
        parallel, indexes re-created exactly as they were (same definitions), so
        the result is the schema the product made, with rows in it."""
        t = time.monotonic()
        defs = self.db.sql(Product.DB, f"""
SELECT 'C' || conname || E'\\t' || pg_get_constraintdef(oid) FROM pg_constraint
 WHERE conrelid = '{table}'::regclass AND contype IN ('p', 'u');
SELECT 'I' || indexrelid::regclass::text || E'\\t' || pg_get_indexdef(indexrelid) FROM pg_index
 WHERE indrelid = '{table}'::regclass
   AND indexrelid NOT IN (SELECT conindid FROM pg_constraint WHERE conrelid = '{table}'::regclass);
""")
        cons = [d[1:].split("\t", 1) for d in defs if d.startswith("C")]
        idx = [d[1:].split("\t", 1) for d in defs if d.startswith("I")]
        drop = [f"ALTER TABLE {table} DROP CONSTRAINT {n};" for n, _ in cons]
        drop += [f"DROP INDEX {n};" for n, _ in idx]
        self.db.sql(Product.DB, "\n".join(drop))
        mid = (first + last) // 2
        procs = []
        for a, b in ((first, mid), (mid + 1, last)):
            if a > b:
                continue
            procs.append(PROCS.popen(f"generate {table}", ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1",
                                                            "-d", self.db.url(Product.DB), "-c", sql_for(a, b, total)],
                                     env=self.db.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        try:
            for p in procs:
                _, err = p.communicate(timeout=900)
                if p.returncode != 0:
                    raise BenchError(f"generating {table}: {err.decode()[-500:]}")
        except subprocess.TimeoutExpired:
            raise BenchError(f"generating {table} took over 900s")
        finally:
            for p in procs:
                PROCS.stop(p)
        create = [f"ALTER TABLE {table} ADD CONSTRAINT {n} {d};" for n, d in cons]
        create += [f"{d};" for _, d in idx]
        self.db.sql(Product.DB, "SET maintenance_work_mem = '512MB';\n" + "\n".join(create), timeout=900)
        return round(time.monotonic() - t, 1)

    def growth_phase(self) -> None:
        h1, h2 = CFG["growth_histories"]
        done_rows = CFG["growth_outbox_done"]
        secs = CFG["growth_secs"]
        if self.ingest:
            self.ingest.stop()
            self.ingest = None
        results = []
        self.db.sql(Product.DB, "TRUNCATE processed_events, outbox;")
        have = 0
        rate = None  # history rows generated per second (indexes rebuilt included)
        sizes = [h1, h2]
        for i in range(2):
            target = sizes[i]
            if i == 1 and rate:
                # The run must end within its budget: a history the time left
                # cannot generate is cut to what it can, and the report says so.
                left = CFG["budget_secs"] - (time.monotonic() - T0)
                # vacuum (grows with the table), the run, the ingest's start and the claims
                fixed = results[0]["vacuum_secs"] * (h2 / h1) ** 0.5 + secs + 8
                step = 1_000_000 if h2 >= 2_000_000 else 100_000
                fits = int((h1 + max(0.0, left - fixed) * rate / 1.15) // step * step)
                if fits < h2:
                    target = sizes[1] = max(fits, 0)
                    note = (f"history cut from {h2:,} to {target:,} events to end within "
                            f"{CFG['budget_secs']} s (generating ran at {rate:,.0f} rows/s)")
                    self.report["growth_cut"] = note
                    log(f"  {note}")
                    if target <= h1:
                        break
            t = time.monotonic()
            gen_events = self.generate("processed_events", history_events_sql, have + 1, target, h2)
            rate = (target - have) / max(gen_events, 0.1)
            have = target
            gen_outbox = None
            if i == 0:
                gen_outbox = self.generate("outbox", history_outbox_sql, 1, done_rows // 2, done_rows // 2)
            t_vac = time.monotonic()
            self.db.sql(Product.DB, """
DELETE FROM outbox WHERE status = 'pending';
UPDATE orders SET status = 'pending', updated_at = now() WHERE status <> 'pending';
VACUUM ANALYZE orders; VACUUM ANALYZE outbox; VACUUM ANALYZE processed_events; CHECKPOINT;""", timeout=1200)
            vac = round(time.monotonic() - t_vac, 1)
            size = self.db.one(Product.DB, "SELECT pg_size_pretty(pg_total_relation_size('processed_events')) "
                                           "|| ' / ' || pg_size_pretty(pg_total_relation_size('outbox'))")
            log(f"  history {target:,} events + {done_rows:,} done outbox rows ({size}): "
                f"events generated in {gen_events}s ({rate:,.0f} rows/s)"
                + (f", outbox rows in {gen_outbox}s" if gen_outbox else "") + f", vacuum {vac}s")
            claim_idle = self.time_claim(f"{target:,} events, nothing due")
            ingest = self.services.start_ingest(f"growth-{target}")
            try:
                s = summary_brief(provider_run(ingest.url, f"growth-{target}", ingest, concurrency=64, secs=secs))
            finally:
                ingest.stop()
            claim = self.time_claim(f"{target:,} events, after the run")
            label = hlabel(target)
            log(f"  c64 with {target:,} events of history: {s['requests_per_s']:,.0f} req/s, p50 {s['p50_ms']} "
                f"p99 {s['p99_ms']} ms")
            results.append({"history_events": target, "done_outbox_rows": done_rows, "sizes": size,
                            "generate_events_secs": gen_events, "generate_rows_per_s": round(rate),
                            "generate_outbox_secs": gen_outbox, "vacuum_secs": vac, "ingest": s,
                            "claim_nothing_due": claim_idle, "claim_after_run": claim})
            self.report[f"ingest_rps_c64_{label}_history"] = s["requests_per_s"]
            self.report[f"ingest_p99_ms_c64_{label}_history"] = s["p99_ms"]
            self.report[f"claim_ms_{label}_history"] = claim["median_ms"]
            self.report[f"claim_ms_idle_{label}_history"] = claim_idle["median_ms"]
        self.details["growth"] = results
        self.report["growth_history_sizes"] = [r["history_events"] for r in results]
        last = results[-1]["history_events"]
        if last != 10_000_000:
            shown = " and ".join(f"{r['history_events']:,}" for r in results)
            self.report["growth_note"] = (f"{CFG['mode']} mode: histories of {shown} events; "
                                          f"ingest_rps_c64_10m_history is the {last:,} figure")
            self.report["ingest_rps_c64_10m_history"] = self.report.get(f"ingest_rps_c64_{hlabel(last)}_history")

    # -------------------------------------------------------------------------
    def run(self) -> None:
        self.phase("setup", self.setup)
        if "setup" in self.errors:
            return
        self.phase("ingest", self.ingest_phase)
        self.phase("half_load", self.half_load_phase)
        self.phase("relay", self.relay_phase)
        self.phase("peer", self.peer_phase)
        self.phase("e2e", self.e2e_phase)
        self.record_rss()
        self.phase("tracing", self.tracing_phase)
        self.phase("relay_log", self.relay_log_phase)
        self.phase("prune", self.prune_phase)
        self.phase("growth", self.growth_phase)

    def drop_databases(self) -> None:
        """The growth history is gigabytes: the databases go unless BENCH_KEEP=1."""
        if os.environ.get("BENCH_KEEP", "") not in ("", "0"):
            log("BENCH_KEEP: keeping bench_product, bench_ref and bench_peer")
            return
        for name in (Product.DB, Reference.DB, "bench_peer"):
            try:
                self.db.sql_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", timeout=120)
            except BenchError as e:
                log(f"  could not drop {name}: {e}")


# --------------------------------------------------------------------------
# The report.

TARGETS = [
    # key, comparison, threshold, what the targets say
    ("ingest_vs_reference_c64", ">=", 1.0, "ingest at 64 clients >= the naive reference (pgbench)"),
    ("ingest_vs_one_statement_c64", ">=", 1.0,
     "as close as possible to the one-statement reference (stretch: 1.0)"),
    ("relay_vs_peer", ">=", 1.0, "relay drain >= graphile-worker on the same database"),
    ("relay_decay_ratio", ">=", 0.9, "three back-to-back drains within 10% of each other"),
    ("ingest_p99_ms_half_load", "<=", 20.0, "p99 ingest latency at half of peak <= 20 ms"),
    ("e2e_p50_ms_idle", "<=", 50.0, "webhook accepted -> downstream called, p50 idle <= 50 ms"),
    ("ingest_rss_mib", "<=", 64.0, "ingest RSS under load <= 64 MiB"),
    ("relay_rss_mib", "<=", 64.0, "relay RSS under load <= 64 MiB"),
]

REQUIRED = ["ingest_rps_c1", "ingest_rps_c16", "ingest_rps_c64", "reference_tps_c64", "ingest_vs_reference_c64",
            "one_statement_tps_c64", "ingest_vs_one_statement_c64", "relay_decay_ratio",
            "ingest_p99_ms_half_load", "relay_rows_per_s_1", "relay_rows_per_s_2", "peer_jobs_per_s",
            "relay_vs_peer", "e2e_p50_ms_idle", "e2e_p99_ms_load", "ingest_rss_mib", "relay_rss_mib",
            "ingest_rps_c64_10m_history"]


def targets(r: dict) -> list[dict]:
    out = []
    for key, op, threshold, what in TARGETS:
        v = r.get(key)
        met = None if v is None else (v >= threshold if op == ">=" else v <= threshold)
        out.append({"key": key, "value": v, "target": f"{op} {threshold:g}", "met": met, "spec": what})
    return out


def fmt(v, digits: int = 0) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, (int, float)):
        if digits == 0 and abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:,.{max(digits, 1) if abs(v) < 100 else digits}f}"
    return str(v)


def tables(r: dict, md: bool) -> str:
    def table(headers: list[str], rows: list[list[str]]) -> str:
        if md:
            lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
            lines += ["| " + " | ".join(row) + " |" for row in rows]
            return "\n".join(lines)
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
        line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
        out = [line, "  ".join("-" * w for w in widths)]
        out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
        return "\n".join(out)

    m = r.get("machine", {})
    s = m.get("postgres_settings", {})
    parts = []
    head = (f"make bench ({r['mode']}), {m.get('cores')} cores ({m.get('cpu_model', '')}), "
            f"{(m.get('memory_mib') or 0) / 1024:.1f} GiB, Linux {m.get('kernel')}, PostgreSQL "
            f"{m.get('postgres_version')} (fsync={s.get('fsync')}, synchronous_commit={s.get('synchronous_commit')}, "
            f"full_page_writes={s.get('full_page_writes')}, wal_sync_method={s.get('wal_sync_method')}, "
            f"shared_buffers={s.get('shared_buffers')}, ssl={s.get('ssl_in_use')}), load average at start "
            f"{m.get('load_average_at_start')}, at end {m.get('load_average_at_end')}, commit {m.get('commit')}")
    parts.append(head if not md else f"_{head}_")

    rows = []
    for c in CONCURRENCIES:
        rows.append([f"{c}", fmt(r.get(f"ingest_rps_c{c}")),
                     f"{fmt(r.get(f'ingest_p50_ms_c{c}'), 2)} / {fmt(r.get(f'ingest_p99_ms_c{c}'), 2)}",
                     fmt(r.get(f"reference_tps_c{c}")),
                     f"{fmt(r.get(f'reference_p50_ms_c{c}'), 2)} / {fmt(r.get(f'reference_p99_ms_c{c}'), 2)}",
                     fmt(r.get(f"one_statement_tps_c{c}")),
                     fmt(r.get(f"ingest_vs_reference_c{c}"), 2), fmt(r.get(f"ingest_vs_one_statement_c{c}"), 2)])
    parts.append(("**Ingest** " if md else "INGEST ")
                 + f"(closed loop, signed, 10% duplicates, {r['config']['ingest_secs']:g} s each; "
                   "pgbench -M prepared at the same concurrency)")
    parts.append(table(["senders", "ours req/s", "ours p50/p99 ms", "naive tps", "naive p50/p99 ms",
                        "one-stmt tps", "vs naive", "vs one-stmt"], rows))

    rows = [
        ["ingest p99 at half of peak (open loop)", f"{fmt(r.get('ingest_p99_ms_half_load'), 2)} ms",
         f"at {fmt(r.get('half_load_rps'))} req/s; p50 {fmt(r.get('ingest_p50_ms_half_load'), 2)} ms"
         + "".join(f"; {n:,} answered {code}" for code, n in (r.get("half_load_status_counts") or {}).items()
                   if code != "200")],
        ["ingest at 64 senders, a relay draining", f"{fmt(r.get('ingest_rps_c64_with_relay'))} req/s",
         f"p99 {fmt(r.get('ingest_p99_ms_c64_with_relay'), 2)} ms; the ingest runs above have no relay"],
        ["ingest p99 at half of peak, relay draining", f"{fmt(r.get('ingest_p99_ms_half_load_with_relay'), 2)} ms",
         "the e2e load run"],
        [f"ingest p99 at half of peak, prune deleting {fmt(r.get('prune_rows'))} rows",
         f"{fmt(r.get('ingest_p99_ms_during_prune'), 2)} ms",
         f"without the prune {fmt(r.get('ingest_p99_ms_baseline_prune'), 2)} ms; p50 "
         f"{fmt(r.get('ingest_p50_ms_baseline_prune'), 2)} -> {fmt(r.get('ingest_p50_ms_during_prune'), 2)} ms; "
         f"prune {fmt(r.get('prune_secs'), 1)} s = {fmt(r.get('prune_rows_per_s'))} rows/s "
         f"at {fmt(r.get('prune_load_rps'))} req/s"],
        ["e2e accepted -> downstream, idle", f"p50 {fmt(r.get('e2e_p50_ms_idle'), 1)} / p99 "
                                              f"{fmt(r.get('e2e_p99_ms_idle'), 1)} ms",
         f"{r['config']['e2e_idle_events']} events at {E2E_RATE:g}/s"],
        ["e2e accepted -> downstream, half-peak load", f"p50 {fmt(r.get('e2e_p50_ms_load'), 1)} / p99 "
                                                        f"{fmt(r.get('e2e_p99_ms_load'), 1)} ms", ""],
        ["relay drain, one relay", f"{fmt(r.get('relay_rows_per_s_1'))} rows/s",
         f"{r['config']['relay_rows']:,} rows, zero-latency downstream"],
        ["relay drain, two relays", f"{fmt(r.get('relay_rows_per_s_2'))} rows/s", ""],
        ["relay drain, log line per call on / off", f"{fmt(r.get('relay_rows_per_s_log_line_on'))} / "
                                                    f"{fmt(r.get('relay_rows_per_s_log_line_off'))} rows/s",
         f"on/off {fmt(r.get('relay_log_line_drain_ratio'), 3)} (relay cpu on/off "
         f"{fmt(r.get('relay_log_line_cpu_ratio'), 3)}); off is RUST_LOG=warn; "
         f"{r['config'].get('log_line_rows', 0):,} rows per drain, on, off, off, on"],
        ["peer (graphile-worker, batching, concurrency 24)", f"{fmt(r.get('peer_jobs_per_s'))} jobs/s",
         f"relay/peer {fmt(r.get('relay_vs_peer'), 2)}"],
        ["three drains, no VACUUM between", " / ".join(fmt(x) for x in r.get("relay_drain_rows_per_s", [])),
         f"slowest/fastest {fmt(r.get('relay_decay_ratio'), 2)}"],
        ["peak RSS (VmHWM)", f"ingest {fmt(r.get('ingest_rss_mib'), 1)} / relay {fmt(r.get('relay_rss_mib'), 1)} MiB",
         f"after the load phases (ingest after the closed-loop runs only: "
         f"{fmt(r.get('ingest_rss_mib_closed_loop'), 1)} MiB)"],
        ["tracing overhead (64 senders, OTLP to a local sink)", f"{fmt(r.get('tracing_overhead_pct'), 1)} %",
         f"{fmt(r.get('ingest_rps_c64_traced'))} req/s traced"],
    ]
    for h in r.get("growth_history_sizes", []):
        label = hlabel(h)
        rows.append([f"c64 with {h:,} processed events, {r['config']['growth_outbox_done']:,} done rows",
                     f"{fmt(r.get(f'ingest_rps_c64_{label}_history'))} req/s",
                     f"p99 {fmt(r.get(f'ingest_p99_ms_c64_{label}_history'), 2)} ms; claim "
                     f"{fmt(r.get(f'claim_ms_{label}_history'), 3)} ms (nothing due "
                     f"{fmt(r.get(f'claim_ms_idle_{label}_history'), 3)} ms)"])
    parts.append("**Latency, relay, memory, growth**" if md else "LATENCY, RELAY, MEMORY, GROWTH")
    parts.append(table(["figure", "value", "context"], rows))

    rows = [[t["key"], fmt(t["value"], 2), t["target"],
             {True: "met", False: "NOT MET", None: "n/a"}[t["met"]]] for t in r.get("targets", [])]
    parts.append("**Targets**" if md else "TARGETS")
    parts.append(table(["key", "value", "target", ""], rows))
    if md:
        parts.append("\n".join(f"- {n}" for n in r.get("notes", [])
                                + ([r["prune_note"]] if r.get("prune_note") else [])
                                + ([r["growth_note"]] if r.get("growth_note") else [])
                                + ([r["growth_cut"]] if r.get("growth_cut") else [])))
    phases = ", ".join(f"{k} {v:g}s" for k, v in r.get("phase_secs", {}).items())
    parts.append(f"Phases: {phases}; total {r.get('total_secs')} s.")
    if r.get("errors"):
        parts.append("ERRORS: " + "; ".join(f"{k}: {v}" for k, v in r["errors"].items()))
    return "\n\n".join(parts) + "\n"


NOTES = [
    "Every ingest run (ours and pgbench's) starts from the same reset state; ours from a history of "
    "processed events and done outbox rows, vacuumed and analyzed, so prepared statements get their "
    "steady-state plans. No relay runs during the ingest runs (the references do not drain either), so "
    "the outbox's pending rows grow through each run; 'ingest at 64 senders, a relay draining' is the "
    "deployed shape.",
    "ours req/s counts every delivery (10% are duplicates, answered from the stored result); "
    "ingest_new_events_per_s_* counts first deliveries only.",
    "Relay drains: the rows are inserted in one transaction with a NOTIFY while the relay runs idle; the "
    "clock starts at COMMIT and stops when no row is pending (every effect seen at the simulator first). "
    "No VACUUM between the three one-relay drains; the two-relay drain follows a VACUUM ANALYZE.",
    "Retention under load: the prune phase makes old done outbox rows and processed events (past "
    "RETENTION_DAYS), vacuums and checkpoints, then runs the ingest at half of peak (open loop, no relay) "
    "for a baseline window and again while `outbox-relay prune` deletes them (1,000 rows per statement, "
    "outbox first); that window starts 0.5 s before the prune and stops when it exits. Before each window "
    "every order is pending again and the outbox has no pending row (vacuumed, checkpointed). prune_secs "
    "is the prune process's wall time; details.prune has, per window, the WAL written and checkpoints "
    "(cluster-wide), autovacuums of the two tables and what the ingest's backends waited on "
    "(pg_stat_activity sampled every 0.2 s).",
    "End to end: effect_at_ms (the simulator's clock, whole milliseconds, floored) minus the time the "
    "sender read the 200; figures are +-1 ms.",
    "The provider, pgbench, the OTLP sink and the simulator run on the same machine as the product and "
    "Postgres: their CPU is part of every figure, as the load average at start shows what else ran.",
]


def write_report(bench: Bench) -> dict:
    r = bench.report
    r["notes"] = NOTES
    r["targets"] = targets(r)
    r["phase_secs"] = bench.phases
    r["total_secs"] = round(time.monotonic() - T0, 1)
    if "machine" in r:
        r["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    r["errors"] = bench.errors
    r["missing_keys"] = [k for k in REQUIRED if r.get(k) is None]
    r["details"] = bench.details
    r["generated_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "report.json").write_text(json.dumps(r, indent=2) + "\n")
    (OUT / "report.md").write_text(tables(r, md=True))
    return r


def main() -> int:
    url = os.environ.get("DATABASE_URL")
    if not url:
        print("bench: DATABASE_URL is not set: run `make bench` (it starts a throwaway Postgres)", file=sys.stderr)
        return 2
    LOGS.mkdir(parents=True, exist_ok=True)

    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    db = Db(url)
    bench = Bench(db)
    log(f"make bench ({CFG['mode']}): logs in {LOGS}")
    interrupted = False
    try:
        bench.run()
    except KeyboardInterrupt:
        interrupted = True
        bench.errors["interrupted"] = "stopped by a signal before the end"
        log("interrupted: stopping everything this run started")
    except BenchError as e:
        bench.errors["fatal"] = str(e)
        log(f"FAILED: {e}")
    finally:
        try:
            bench.record_rss() if not bench.rss.get("ingest") else None
        except Exception:  # noqa: BLE001
            pass
        PROCS.stop_all()
        if not interrupted:
            bench.drop_databases()
    r = write_report(bench)
    print()
    print(tables(r, md=False))
    print(f"report: {OUT / 'report.json'} and {OUT / 'report.md'}")
    if r["missing_keys"]:
        print(f"missing: {', '.join(r['missing_keys'])}")
    return 130 if interrupted else (1 if bench.errors else 0)


if __name__ == "__main__":
    sys.exit(main())
