"""The processes under test and beside them: the simulated downstream (its
stats and reset), the ingest and the relay, each started against
bench_product and waited for until ready."""

from __future__ import annotations

import json
import os
import select
import subprocess
import threading
import time

from ports import free_port

from .common import PROCS, clean_env, http_get, http_post, proc_cpu_secs, rss_mib, wait_ready
from .config import BIN, LOGS, SECRET, BenchError, log
from .db import Db, Product


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
