"""Generated history, as the product writes it: processed events and done
outbox rows, and bulk generation with the indexes dropped and re-created."""

from __future__ import annotations

import subprocess
import time
from typing import TYPE_CHECKING

from .common import PROCS
from .config import HISTORY_ORDER0, TRACEPARENT, BenchError

if TYPE_CHECKING:
    from .runner import Bench


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


def generate(bench: Bench, table: str, sql_for, first: int, last: int, total: int) -> float:
    """Bulk history: indexes dropped, rows inserted by two sessions in
    parallel, indexes re-created exactly as they were (same definitions), so
    the result is the schema the product made, with rows in it."""
    t = time.monotonic()
    defs = bench.db.sql(bench.product.DB, f"""
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
    bench.db.sql(bench.product.DB, "\n".join(drop))
    mid = (first + last) // 2
    procs = []
    for a, b in ((first, mid), (mid + 1, last)):
        if a > b:
            continue
        procs.append(PROCS.popen(f"generate {table}", ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1",
                                                        "-d", bench.db.url(bench.product.DB), "-c", sql_for(a, b, total)],
                                 env=bench.db.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE))
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
    bench.db.sql(bench.product.DB, "SET maintenance_work_mem = '512MB';\n" + "\n".join(create), timeout=900)
    return round(time.monotonic() - t, 1)
