"""Postgres through psql (the standard library has no driver): SQL, sessions, the databases,
and generated history as the product writes it."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from .common import BIN, HISTORY_ORDER0, LOGS, ORDERS, REFS, TRACEPARENT, BenchError
from .common import clean_env, popen, read_lines, run_cmd, stop

PRODUCT, REFERENCE, FRESH, PEER = "bench_product", "bench_ref", "bench_fresh", "bench_peer"
PSQL = ["psql", "-X", "-q", "-A", "-t"]
VACUUM = "VACUUM ANALYZE outbox; VACUUM ANALYZE processed_events; CHECKPOINT;"


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
        """Runs `sql` on `db` (None: the admin URL's); rows as 'a|b' lines."""
        args = [*PSQL, "-v", "ON_ERROR_STOP=1", "-d", self.url(db) if db else self.admin]
        _, out, _ = run_cmd(f"psql {db or 'admin'}", args, timeout, self.env(), stdin=sql)
        return [line for line in out.splitlines() if line != ""]

    def recreate(self, db: str) -> None:
        self.sql(None, f"DROP DATABASE IF EXISTS {db} WITH (FORCE);\nCREATE DATABASE {db};")

    def create_product(self, name: str = PRODUCT) -> None:
        """The product's schema (migrated) and 1M orders."""
        self.recreate(name)
        run_cmd("webhook-ingest migrate", [BIN / "webhook-ingest", "migrate"], timeout=120,
                env=clean_env({"DATABASE_URL": self.url(name), "LOG_FORMAT": "json"}))
        self.sql(name, f"INSERT INTO orders (id, payment_id) SELECT n, 'pay_' || n FROM "
                       f"generate_series(1, {ORDERS}) n; VACUUM ANALYZE orders;", timeout=300)

    def reset_product(self, history: int, name: str = PRODUCT) -> None:
        """Where every measured run starts: some history (so prepared statements settle on
        their steady-state plans), every order pending, vacuumed, analyzed, checkpointed."""
        self.sql(name, f"""TRUNCATE processed_events, outbox;
{history_events_sql(1, history, history)};
{history_outbox_sql(1, history // 2, history // 2)};
UPDATE orders SET status = 'pending', updated_at = now() WHERE status <> 'pending';
VACUUM ANALYZE orders; {VACUUM}""", timeout=600)

    def undo_run(self) -> None:
        """Every order pending again and no pending outbox row; the run's events stay."""
        self.sql(PRODUCT, f"""DELETE FROM outbox WHERE status = 'pending';
UPDATE orders SET status = 'pending', updated_at = now() WHERE status <> 'pending';
VACUUM ANALYZE orders; {VACUUM}""", timeout=1200)

    def pgbench(self, tag: str, args: list, timeout: float) -> str:
        """pgbench (prepared statements) on bench_ref; its output, kept in the logs."""
        args = ["pgbench", "-n", "-M", "prepared", "-D", f"run={time.time_ns()}", "-D", "n=0",
                *args, self.url(REFERENCE)]
        _, out, err = run_cmd(f"pgbench {tag}", args, timeout, self.env())
        (LOGS / f"pgbench-{tag}.out").write_text(out + err)
        return out

    def create_reference(self) -> None:
        self.recreate(REFERENCE)
        self.sql(REFERENCE, (REFS / "schema.sql").read_text(), timeout=300)

    def reset_reference(self) -> None:
        # As bench/README.md says: empty the written tables, reset the orders.
        self.sql(REFERENCE, """TRUNCATE processed_events, outbox;
UPDATE orders SET status = 'pending', paid_at = NULL WHERE status <> 'pending';
VACUUM ANALYZE orders; ANALYZE processed_events; ANALYZE outbox; CHECKPOINT;""", timeout=300)


class Session:
    """One persistent psql connection, for polling and timed statements."""

    def __init__(self, db: Db, name: str) -> None:
        self.p = popen([*PSQL, "-v", "ON_ERROR_STOP=0", "-d", db.url(name)], env=db.env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        self.buf, self.n = b"", 0

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
        deadline = time.monotonic() + timeout
        while pending := self.pending():
            if time.monotonic() > deadline:
                raise BenchError(f"{what}: {pending:,} rows pending after {timeout:.0f}s")
            time.sleep(every)

    def backend_pid(self) -> int:
        return int(self.query("SELECT pg_backend_pid();")[0])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.p.stdin.write(b"\\q\n")
            self.p.stdin.flush()
        stop(self.p, grace=5)


def history_events_sql(first: int, last: int, total: int, *, seed: str = "hist",
                       order0: int = HISTORY_ORDER0, days_ago: int = 0) -> str:
    """Processed events as the ingest writes them over the six days before `days_ago` (by
    default inside the 7-day retention), ids random like a provider's, orders `order0` + n."""
    return f"""
INSERT INTO processed_events (event_id, event_type, status, processed_at, result, payload,
                              order_id, deliveries, last_delivered_at, trace_context)
SELECT 'evt_' || h, 'payment.succeeded', 'processed', t,
       ('{{"event_id":"evt_' || h || '","status":"processed","order_id":' || o || '}}')::jsonb,
       ('{{"id":"evt_' || h || '","type":"payment.succeeded","data":{{"payment_id":"pay_' || o
        || '","amount":4200,"currency":"gbp"}}}}')::jsonb,
       o, 1, t, '{TRACEPARENT}'
FROM generate_series({first}, {last}) n,
     LATERAL (SELECT now() - interval '{days_ago} days' - ({total} - n) * (interval '6 days'
                     / {total}) AS t, {order0} + n AS o, substr(md5('{seed}' || n), 1, 24) AS h
              OFFSET 0) x
"""


def history_outbox_sql(first: int, last: int, total: int, *, order0: int = HISTORY_ORDER0,
                       days_ago: int = 0) -> str:
    """Done outbox rows, a shipment and a confirmation per order, over the same six days."""
    return f"""
INSERT INTO outbox (kind, payload, idempotency_key, status, attempts, event_id, order_id,
                    trace_context, created_at, available_at, finished_at)
SELECT k.kind, ('{{"v":1,"order_id":' || o || ',"event_id":"evt_h' || o || '"}}')::jsonb,
       k.prefix || '-' || o, 'done', 1, 'evt_h' || o, o, '{TRACEPARENT}', t, t,
       t + interval '20 milliseconds'
FROM generate_series({first}, {last}) n,
     LATERAL (SELECT now() - interval '{days_ago} days' - ({total} - n) * (interval '6 days'
                     / {total}) AS t, {order0} + n AS o) x,
     (VALUES ('ship_order', 'ship'), ('send_confirmation', 'conf')) AS k(kind, prefix)
"""


def generate(db: Db, table: str, sql_for, first: int, last: int, total: int) -> None:
    """Bulk history on bench_product: indexes dropped, rows inserted by two sessions, indexes
    re-created exactly as they were (the product's schema, with rows in it)."""
    defs = db.sql(PRODUCT, f"""
SELECT format('ALTER TABLE {table} DROP CONSTRAINT %I;', conname) || E'\\t'
       || format('ALTER TABLE {table} ADD CONSTRAINT %I %s;', conname, pg_get_constraintdef(oid))
  FROM pg_constraint WHERE conrelid = '{table}'::regclass AND contype IN ('p', 'u')
UNION ALL
SELECT format('DROP INDEX %s;', indexrelid::regclass) || E'\\t' || pg_get_indexdef(indexrelid)
       || ';' FROM pg_index
 WHERE indrelid = '{table}'::regclass AND indexrelid NOT IN
       (SELECT conindid FROM pg_constraint WHERE conrelid = '{table}'::regclass);""")
    drop, create = zip(*(d.split("\t") for d in defs))
    db.sql(PRODUCT, "\n".join(drop))
    mid = (first + last) // 2
    halves = [ab for ab in ((first, mid), (mid + 1, last)) if ab[0] <= ab[1]]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda ab: db.sql(PRODUCT, sql_for(*ab, total), timeout=900), halves))
    db.sql(PRODUCT, "SET maintenance_work_mem = '512MB';\n" + "\n".join(create), timeout=900)
