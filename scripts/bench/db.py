"""Postgres through psql (the standard library has no driver): one-shot SQL,
persistent sessions for polling and timed statements, and the two databases
the ingest runs are measured on (bench_product and bench_ref)."""

from __future__ import annotations

import os
import re
import select
import subprocess
import time

from .common import PROCS, clean_env, run_cmd
from .config import BENCH_REFERENCES, BIN, ORDERS, BenchError
from .history import history_events_sql, history_outbox_sql


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

