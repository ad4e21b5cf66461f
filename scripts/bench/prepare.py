"""The `setup` phase (runner.PHASES): the three databases, the downstream,
the peer's node_modules (once), and what the machine is."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from .common import clean_env, run_cmd
from .config import BENCH_REFERENCES, BIN, LOAD0, OUT, PRODUCT_VARS, ROOT, BenchError, log
from .db import Db, Product

if TYPE_CHECKING:
    from .runner import Bench


def run(bench: Bench) -> None:
    for name in ("webhook-ingest", "outbox-relay", "simulator"):
        if not os.access(BIN / name, os.X_OK):
            raise BenchError(f"{BIN / name} is missing: run `make release` first (make bench does)")
    for tool in ("psql", "pgbench", "node", "npm"):
        if not shutil.which(tool):
            raise BenchError(f"`{tool}` is not on PATH; the bench needs it")
    for f in ("schema.sql", "reference-ingest.sql", "reference-ingest-one-statement.sql", "reference-relay.sql",
              "reference-relay-one-statement.sql", "peer/peer.js"):
        if not (BENCH_REFERENCES / f).exists():
            raise BenchError(f"{BENCH_REFERENCES / f} is missing")
    # The three databases, the peer's dependencies: in parallel, nothing is measured yet.
    peer = threading.Thread(target=prepare_peer, args=(bench,), daemon=True)
    peer.start()
    ref_err: list[Exception] = []

    def make_ref() -> None:
        try:
            bench.ref.create()
        except Exception as e:  # noqa: BLE001
            ref_err.append(e)

    ref = threading.Thread(target=make_ref, daemon=True)
    ref.start()
    bench.product.create()
    bench.db.recreate("bench_peer")
    bench.services.start_downstream()
    ref.join(timeout=400)
    peer.join(timeout=300)
    if ref.is_alive():
        raise BenchError("loading the reference schema took over 400s")
    if ref_err:
        raise BenchError(f"reference database: {ref_err[0]}")
    if bench.peer_error:
        bench.errors["peer_setup"] = bench.peer_error
    bench.report["machine"] = machine(bench.db)
    m = bench.report["machine"]
    s = m["postgres_settings"]
    log(f"machine: {m['cores']} cores, {m['memory_mib']} MiB, {m['kernel']}, PostgreSQL "
        f"{m['postgres_version']}, fsync={s.get('fsync')} synchronous_commit={s.get('synchronous_commit')} "
        f"full_page_writes={s.get('full_page_writes')} shared_buffers={s.get('shared_buffers')}, "
        f"load {m['load_average_at_start']}")


def prepare_peer(bench: Bench) -> None:
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
        bench.peer_error = f"preparing the peer: {e}"


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
