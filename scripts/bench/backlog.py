"""The `backlog` phase (runner.PHASES): backlog.sql runs every 5 s on every
relay pod, so a gauge that scans the whole backlog shows here. The rows are
removed after."""

from __future__ import annotations

import re
import statistics
from typing import TYPE_CHECKING

from .common import hlabel
from .config import CFG, ROOT, BenchError, log
from .db import Product

if TYPE_CHECKING:
    from .runner import Bench

# Pending rows: a few million in full mode, fewer in quick mode.
PENDING = {"full": 3_000_000, "quick": 300_000}


def backlog_sql() -> str:
    path = ROOT / "crates" / "outbox-relay" / "src" / "storage" / "backlog.sql"
    if not path.exists():
        raise BenchError(f"the relay's backlog statement is not at {path}")
    return path.read_text().strip().rstrip(";")


def run(bench: Bench) -> None:
    n = PENDING.get(CFG["mode"], 300_000)
    statement = backlog_sql()
    bench.db.sql(Product.DB, f"""
TRUNCATE outbox;
INSERT INTO outbox (kind, payload, idempotency_key, event_id, order_id, created_at, available_at)
SELECT 'ship_order', jsonb_build_object('v', 1, 'order_id', o, 'event_id', 'evt_' || o),
       'ship-' || o, 'evt_' || o, o, now() - interval '1 hour' + o * interval '1 ms',
       now() - interval '1 hour' + o * interval '1 ms'
         + CASE WHEN o % 10 = 0 THEN interval '2 hours' ELSE interval '0' END
  FROM generate_series(1, {n}) AS o;
VACUUM ANALYZE outbox;""", timeout=1200)
    try:
        out = bench.db.sql(Product.DB, "\n".join([f"EXPLAIN (ANALYZE) {statement};"] * 7), timeout=600)
    finally:
        bench.db.sql(Product.DB, "TRUNCATE outbox;", timeout=300)
    times = [float(x) for x in re.findall(r"Execution Time: ([\d.]+) ms", "\n".join(out))]
    if not times:
        raise BenchError("the backlog statement gave no timing")
    median = round(statistics.median(times), 3)
    log(f"  backlog gauges: {median} ms with {n:,} pending rows")
    bench.details["backlog"] = {"pending_rows": n, "all_ms": times, "median_ms": median}
    bench.report["backlog_pending_rows"] = n
    bench.report[f"backlog_gauge_ms_{hlabel(n)}_pending"] = median
