"""The phases in order (PHASES, the one list), each announced as `[n/of] name ...` and timed,
its errors recorded (one failing phase does not stop the others); the `setup` phase; `main`."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import db_cpu, e2e, fresh, history, ingest, relay
from .common import BIN, CFG, LOAD0, LOGS, ONLY, OUT, REFS, ROOT, T0
from .common import BenchError, clean_env, log, run_cmd, stop_all
from .db import FRESH, PEER, PRODUCT, REFERENCE, Db
from .report import tables, write_documents, write_report
from .services import Bench


def setup(bench: Bench) -> None:
    """The three databases, the downstream, the peer's node_modules (once), the machine."""
    for name in ("webhook-ingest", "outbox-relay", "simulator"):
        if not os.access(BIN / name, os.X_OK):
            raise BenchError(f"{BIN / name} is missing: run `make release` (make bench does)")
    for tool in ("psql", "pgbench", "node", "npm"):
        if not shutil.which(tool):
            raise BenchError(f"`{tool}` is not on PATH; the bench needs it")
    # In parallel: nothing is measured yet.
    with ThreadPoolExecutor(2) as pool:
        peer, ref = pool.submit(prepare_peer), pool.submit(bench.db.create_reference)
        bench.db.create_product()
        bench.db.recreate(PEER)
        bench.start_downstream()
        ref.result(timeout=400)
        try:
            peer.result(timeout=300)
        except (BenchError, OSError) as e:  # the peer phase fails with this, the others run
            bench.peer_error = bench.errors["peer_setup"] = f"preparing the peer: {e}"
    m = bench.report["machine"] = machine(bench.db)
    log(f"machine: {m['cores']} cores, {m['memory_mib']} MiB, PostgreSQL "
        f"{m['postgres_version']}, {m['postgres_settings']}, load {m['load_average_at_start']}")


def prepare_peer() -> None:
    dst = OUT / "peer"
    dst.mkdir(parents=True, exist_ok=True)
    for f in ("package.json", "peer.js"):
        if (dst / f).exists():
            (dst / f).chmod(0o644)
        shutil.copyfile(REFS / "peer" / f, dst / f)
    if not (dst / "node_modules" / "graphile-worker").is_dir():
        log("  peer: installing graphile-worker (npm, once)")
        run_cmd("npm install", ["npm", "install", "--no-audit", "--no-fund"], timeout=240,
                cwd=dst, env=clean_env())


def machine(db: Db) -> dict:
    settings = dict(row.split("|", 1) for row in db.sql(PRODUCT, """
SELECT name, current_setting(name) FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit',
       'full_page_writes', 'wal_sync_method', 'shared_buffers', 'max_wal_size',
       'checkpoint_timeout', 'wal_compression', 'commit_delay', 'jit') ORDER BY name;
SELECT 'server_version', current_setting('server_version');"""))
    text = {f: Path(f"/proc/{f}").read_text() for f in ("meminfo", "cpuinfo")}
    mem = re.search(r"^MemTotal:\s+(\d+)", text["meminfo"], re.M)
    model = re.search(r"^model name\s*:\s*(.*)$", text["cpuinfo"], re.M)

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                              timeout=10).stdout.strip()

    dirty = "-dirty" if git("status", "--porcelain", "-uno") else ""
    return {"cores": os.cpu_count(), "cpu_model": model.group(1).strip() if model else "",
            "memory_mib": int(mem.group(1)) // 1024 if mem else 0,
            "kernel": platform.release(), "load_average_at_start": [round(x, 2) for x in LOAD0],
            "postgres_version": settings.pop("server_version", ""),
            "postgres_settings": settings, "commit": git("rev-parse", "--short", "HEAD") + dirty}


# Every phase in the order it runs, and what it measures: the one list (`python3 -m bench
# --list`; docs/BENCHMARK.md's table is written from it).
PHASES = [
    ("setup", setup, "databases `bench_product` (migrated, 1M orders, some history), `bench_ref` "
     "(`bench/schema.sql`), `bench_peer` (empty); the downstream simulator; the peer's modules; "
     "the machine"),
    ("ingest", ingest.run, "closed loop at 1, 16 and 64 senders (signed, 10% duplicates), each "
     "beside pgbench running both reference ingests at the same concurrency and duration; at 64 "
     "senders three alternated pairs; every run starts from the same reset state"),
    ("half_load", ingest.run_half_load, "open loop at half of the measured peak: p50, p99"),
    ("relay", relay.run, "50,000 rows (quick: 30,000) inserted at once (one transaction with a "
     "`NOTIFY`) while the relay runs idle; three back-to-back drains with one relay (no VACUUM "
     "between them), one with two relays (after a VACUUM); then the ingest at 64 senders with a "
     "relay delivering, until nothing is pending: the end-to-end peak"),
    ("peer", relay.run_peer, "graphile-worker (`bench/peer`, batching, concurrency 24) draining "
     "as many no-op jobs, then as many jobs that each POST to the downstream (`--http`)"),
    ("e2e", e2e.run, "webhook accepted to downstream effect: idle (20 events/s, one by one), "
     "while a provider load runs at half of the end-to-end peak, then at half of the ingest's "
     "own peak"),
    ("db_cpu", db_cpu.run, "Postgres CPU per webhook: the ingest at half of peak with a relay "
     "delivering, then pgbench at the same rate on the naive design (ingest and relay scripts "
     "25:1), each until nothing is pending; two rounds (ours, naive, then naive, ours), added up"),
    ("prune", history.run_prune, "retention under load: 1M done outbox rows and 1M processed "
     "events 30 days old (quick: 50k each); the ingest at half of peak for a baseline window, "
     "then while `outbox-relay prune` deletes them"),
    ("growth", history.run_growth, "64 senders and the relay's claim time with 1M and 10M "
     "processed events and 1M done outbox rows behind them (quick: 100k and 500k, 100k)"),
    ("fresh", fresh.run, "a new ingest's first 15 s at 64 senders on a just-migrated database, "
     "against the steady state on the same database; then a new relay over the backlog those "
     "payments left"),
    ("outage", fresh.run_outage, "a new relay over 500,000 rows due at once after a downstream "
     "outage, on six days of history (quick: less history)"),
]


def run_all(bench: Bench) -> None:
    """Every phase, or setup and those BENCH_PHASES names."""
    phases = [p for p in PHASES if not ONLY or p[0] == "setup" or p[0] in ONLY]
    for i, (name, fn, _) in enumerate(phases, 1):
        number, t = f"[{i}/{len(phases)}]", time.monotonic()
        log(f"{number} {name} ...")
        try:
            fn(bench)
        except BenchError as e:
            bench.errors[name] = str(e)
        except Exception as e:  # noqa: BLE001 - a bug or a surprise: the other phases run
            with open(LOGS / "bench-errors.log", "a") as f:
                f.write(f"--- phase {name}\n{traceback.format_exc()}\n")
            bench.errors[name] = f"{type(e).__name__}: {e} (traceback in {LOGS})"
        if name in bench.errors:
            log(f"{number} {name} FAILED: {bench.errors[name]}")
        bench.phases[name] = round(time.monotonic() - t, 1)
        log(f"{number} {name} done ({bench.phases[name]:.1f} s; "
            f"{time.monotonic() - T0:.0f} s since the start)")
        if name == "setup" and "setup" in bench.errors:
            return
        if name == "e2e":
            bench.record_rss()  # after the load phases, whichever ran


def main(argv: list[str]) -> int:
    if argv == ["--list"]:
        print("\n".join(f"{i:2}. {name:10} {what}" for i, (name, _, what) in enumerate(PHASES, 1)))
        return 0
    if argv == ["--docs"]:
        report = OUT / "report.json"
        return write_docs(json.loads(report.read_text()) if report.exists() else None, True)
    if argv or not os.environ.get("DATABASE_URL"):
        print("usage: python3 -m bench [--list | --docs] with DATABASE_URL set: run `make bench` "
              "(it starts a throwaway Postgres; see docs/BENCHMARK.md)", file=sys.stderr)
        return 2
    LOGS.mkdir(parents=True, exist_ok=True)

    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    bench = Bench(Db(os.environ["DATABASE_URL"]))
    log(f"make bench ({CFG['mode']}): logs in {LOGS}")
    interrupted = False
    try:
        run_all(bench)
    except KeyboardInterrupt:
        interrupted = True
        bench.errors["interrupted"] = "stopped by a signal before the end"
        log("interrupted: stopping everything this run started")
    finally:
        if not bench.rss.get("ingest"):
            bench.record_rss()  # the e2e phase records it; after an error in it, here
        stop_all()
        if not interrupted:
            drop_databases(bench)
    r = write_report(bench)
    print(f"\n{tables(r)}\nreport: {OUT / 'report.json'} and {OUT / 'report.md'}")
    if r["missing_keys"]:
        print(f"missing: {', '.join(r['missing_keys'])}")
    write_docs(r)
    return 130 if interrupted else (1 if bench.errors else 0)


def write_docs(r: dict | None, phase_table_anyway: bool = False) -> int:
    changed, why = write_documents(r, PHASES, phase_table_anyway=phase_table_anyway)
    print(f"documents: {', '.join(map(str, changed)) or 'unchanged'}"
          + (f" (no figures: {why})" if why else ""))
    return 0


def drop_databases(bench: Bench) -> None:
    """The growth history is gigabytes."""
    for name in (PRODUCT, REFERENCE, PEER, FRESH):
        try:
            bench.db.sql(None, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", timeout=120)
        except BenchError as e:
            log(f"  could not drop {name}: {e}")
