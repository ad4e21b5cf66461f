"""Postgres through psql (the standard library has no driver): one-shot SQL,
persistent sessions for polling and timed statements, the two databases
the ingest runs are measured on (bench_product and bench_ref), and generated
history (processed events, done outbox rows) as the product writes it."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from .common import PROCS, clean_env, read_lines, run_cmd
from .config import BIN, HISTORY_ORDER0, ORDERS, REFS, TRACEPARENT, BenchError

PSQL = ["psql", "-X", "-q", "-A", "-t"]


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
        return {"PGCONNECT_TIMEOUT": "10", **clean_env()}

    def sql(self, db: str | None, sql: str, timeout: float = 120.0) -> list[str]:
        """Runs SQL (one or more statements) in one psql process on `db` (None:
        the admin URL's database); rows as 'a|b' lines."""
        _, out, _ = run_cmd(f"psql {db or 'admin'}",
                            [*PSQL, "-v", "ON_ERROR_STOP=1", "-d", self.url(db) if db else self.admin],
                            timeout=timeout, env=self.env(), stdin=sql)
        return [line for line in out.splitlines() if line != ""]

    def recreate(self, db: str) -> None:
        self.sql(None, f"DROP DATABASE IF EXISTS {db} WITH (FORCE);\nCREATE DATABASE {db};")


class Session:
    """One persistent psql connection: for polling and for timed statements
    without a process (and a connection) per query."""

    def __init__(self, db: Db, name: str) -> None:
        self.p = PROCS.popen([*PSQL, "-v", "ON_ERROR_STOP=0", "-d", db.url(name)], env=db.env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.buf = b""
        self.n = 0

    def query(self, sql: str, timeout: float = 60.0) -> list[str]:
        """Sends `sql` and a marker, then reads its output up to the marker."""
        self.n += 1
        marker = f"__bench_{self.n}__"
        self.p.stdin.write(f"{sql}\n\\echo {marker}\n".encode())
        self.p.stdin.flush()
        lines, self.buf = read_lines(self.p, lambda line: line == marker, timeout, self.buf)
        if errors := [x for x in lines if "ERROR:" in x or "FATAL:" in x]:
            raise BenchError("psql: " + " / ".join(errors))
        return [x for x in lines[:-1] if x]

    def pending(self) -> int:
        return int(self.query("SELECT count(*) FROM outbox WHERE status = 'pending';")[0])

    def wait_drained(self, timeout: float, what: str, every: float) -> None:
        """Polls every `every` s until no outbox row is pending."""
        deadline = time.monotonic() + timeout
        while pending := self.pending():
            if time.monotonic() > deadline:
                raise BenchError(f"{what}: {pending:,} outbox rows still pending after {timeout:.0f}s")
            time.sleep(every)

    def backend_pid(self) -> int:
        return int(self.query("SELECT pg_backend_pid();")[0])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.p.stdin.write(b"\\q\n")
            self.p.stdin.flush()
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
VACUUM ANALYZE orders; VACUUM ANALYZE processed_events; VACUUM ANALYZE outbox; CHECKPOINT;""", timeout=600)

    def undo_run(self) -> None:
        """Every order pending again (a provider run pays orders 1, 2, ..: the
        next would find them paid) and no pending outbox row; the run's
        processed events stay (recent, new ids). Vacuumed, checkpointed."""
        self.db.sql(self.DB, """
DELETE FROM outbox WHERE status = 'pending';
UPDATE orders SET status = 'pending', updated_at = now() WHERE status <> 'pending';
VACUUM ANALYZE orders; VACUUM ANALYZE outbox; VACUUM ANALYZE processed_events; CHECKPOINT;""", timeout=1200)


class Reference(Product):
    """bench_ref: the reference designs' tables (bench/schema.sql)."""

    DB = "bench_ref"

    def create(self) -> None:
        self.db.recreate(self.DB)
        self.db.sql(self.DB, (REFS / "schema.sql").read_text(), timeout=300)

    def reset(self) -> None:  # type: ignore[override]
        # As bench/README.md says: empty the written tables, reset the orders.
        self.db.sql(self.DB, """
TRUNCATE processed_events, outbox;
UPDATE orders SET status = 'pending', paid_at = NULL WHERE status <> 'pending';
VACUUM ANALYZE orders; ANALYZE processed_events; ANALYZE outbox; CHECKPOINT;""", timeout=300)


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


def generate(db: Db, table: str, sql_for, first: int, last: int, total: int) -> None:
    """Bulk history: indexes dropped, rows inserted by two sessions in
    parallel, indexes re-created exactly as they were (same definitions), so
    the result is the schema the product made, with rows in it."""
    defs = db.sql(Product.DB, f"""
SELECT format('ALTER TABLE {table} DROP CONSTRAINT %I;', conname) || E'\\t'
       || format('ALTER TABLE {table} ADD CONSTRAINT %I %s;', conname, pg_get_constraintdef(oid))
  FROM pg_constraint WHERE conrelid = '{table}'::regclass AND contype IN ('p', 'u')
UNION ALL
SELECT format('DROP INDEX %s;', indexrelid::regclass) || E'\\t' || pg_get_indexdef(indexrelid) || ';' FROM pg_index
 WHERE indrelid = '{table}'::regclass
   AND indexrelid NOT IN (SELECT conindid FROM pg_constraint WHERE conrelid = '{table}'::regclass);""")
    drop, create = zip(*(d.split("\t") for d in defs))
    db.sql(Product.DB, "\n".join(drop))
    mid = (first + last) // 2
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda ab: db.sql(Product.DB, sql_for(*ab, total), timeout=900),
                      [ab for ab in ((first, mid), (mid + 1, last)) if ab[0] <= ab[1]]))
    db.sql(Product.DB, "SET maintenance_work_mem = '512MB';\n" + "\n".join(create), timeout=900)
