"""Modes and sizes (BENCH_QUICK, BENCH_PHASES, BENCH_BIN), the constants
every phase shares, the error type and the log line."""

from __future__ import annotations

import base64
import os
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The binaries measured; BENCH_BIN points at another build's directory (to
# compare two commits' binaries with the same harness, docs/BENCHMARK.md).
BIN = Path(os.environ.get("BENCH_BIN") or ROOT / "target" / "release")
OUT = ROOT / "target" / "bench"
LOGS = OUT / "logs"
REFS = ROOT / "bench"
QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0", "false", "no")

# Sizes and durations, (quick, full).
SIZES = dict(  # grouped by phase
    ingest_secs=(3.0, 15.0), half_secs=(4.0, 15.0), product_history=(5_000, 50_000),
    relay_rows=(30_000, 50_000), peak_secs=(3.0, 8.0), peer_jobs=(30_000, 50_000),
    e2e_idle_events=(40, 100), e2e_load_secs=(5.0, 10.0), db_cpu_secs=(10.0, 20.0),
    prune_outbox_rows=(50_000, 1_000_000), prune_events=(50_000, 1_000_000), prune_timeout_secs=(90, 600),
    growth_secs=(3.0, 8.0), growth_histories=((100_000, 500_000), (1_000_000, 10_000_000)),
    growth_outbox_done=(100_000, 1_000_000),
    fresh_secs=(15.0, 15.0), outage_due_rows=(500_000, 500_000), outage_history_events=(100_000, 1_000_000),
    outage_done_rows=(100_000, 1_000_000),
)
CFG = {"mode": "quick" if QUICK else "full", **{k: v[0 if QUICK else 1] for k, v in SIZES.items()}}
if os.environ.get("BENCH_BIN"):
    CFG["bench_bin"] = str(BIN)
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
OUTAGE_ORDER0 = 60_000_000
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
