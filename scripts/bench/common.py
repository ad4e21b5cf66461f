"""What every phase shares: modes (BENCH_QUICK, BENCH_PHASES), sizes and constants, errors
and the log line, the processes started (each stopped at exit), commands, HTTP, /proc."""

from __future__ import annotations

import base64
import contextlib
import os
import re
import select
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "target" / "release"
OUT = ROOT / "target" / "bench"
LOGS = OUT / "logs"
REFS = ROOT / "bench"
QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0", "false", "no")
ONLY = {p.strip() for p in os.environ.get("BENCH_PHASES", "").split(",") if p.strip()}

SIZES = dict(  # (quick, full), by phase
    ingest_secs=(3.0, 15.0), half_secs=(4.0, 15.0), product_history=(5_000, 50_000),
    relay_rows=(30_000, 50_000), peak_secs=(3.0, 8.0), peer_jobs=(30_000, 50_000),
    e2e_idle_events=(40, 100), e2e_load_secs=(5.0, 10.0), db_cpu_secs=(10.0, 20.0),
    prune_outbox_rows=(50_000, 1_000_000), prune_events=(50_000, 1_000_000),
    prune_timeout_secs=(90, 600), growth_secs=(3.0, 8.0),
    growth_histories=((100_000, 500_000), (1_000_000, 10_000_000)),
    growth_outbox_done=(100_000, 1_000_000), fresh_secs=(15.0, 15.0),
    outage_due_rows=(500_000, 500_000), outage_history_events=(100_000, 1_000_000),
    outage_done_rows=(100_000, 1_000_000),
)
CFG = {"mode": "quick" if QUICK else "full"}
CFG.update({k: v[0 if QUICK else 1] for k, v in SIZES.items()})

CONCURRENCIES = (1, 16, 64)
ORDERS = 1_000_000  # as the reference schema: pay_1 .. pay_1000000
DUPLICATE_RATE = 0.1
# Duplicates follow their first delivery within 100 ms (the provider's default is 1 s): a
# short run would otherwise end on a second of trailing duplicates, understating the rate.
DUPLICATE_DELAY = "0..100"
E2E_RATE = 20.0  # events per second sent one by one for the end-to-end figures
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
SECRET = "whsec_" + base64.b64encode(b"make-bench-secret-24byte").decode()
# Order ranges, so no phase's idempotency keys meet another's.
E2E_IDLE_ORDER0, E2E_LOAD_ORDER0, HISTORY_ORDER0 = 990_000, 995_000, 5_000_000
DRAIN_ORDER0, PRUNE_ORDER0, OUTAGE_ORDER0 = 20_000_000, 40_000_000, 60_000_000
# The prune phase's old rows are this old; the prune runs with the default retention.
PRUNE_AGE_DAYS, RETENTION_DAYS = 30, 7

# The product reads these; the bench measures its defaults, so they are unset for the
# processes it starts (and recorded if the caller had set them).
PRODUCT_VARS = re.compile(
    r"^(OTEL_|RUST_LOG$|LOG_FORMAT$|DATABASE_(?!URL$)|RELAY_|INGEST_|WEBHOOK_|ADMIN_LISTEN_ADDR$|"
    r"FULFILMENT_URL$|EMAIL_URL$|RETENTION_DAYS$|PROVIDER_|DOWNSTREAM_)"
)
T0, LOAD0 = time.monotonic(), os.getloadavg()  # LOAD0: what else the machine was doing


class BenchError(Exception):
    pass


def log(msg: str) -> None:
    print(f"[bench {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


PROCS: list[subprocess.Popen] = []  # the processes running; stop_all stops them at exit


def popen(args: list, **kw) -> subprocess.Popen:
    # Own session: a Ctrl-C reaches only this script, which then stops its children.
    PROCS.append(p := subprocess.Popen([str(a) for a in args], start_new_session=True, **kw))
    return p


def stop(p: subprocess.Popen, grace: float = 15.0) -> int | None:
    """SIGTERM, then SIGKILL after `grace` seconds."""
    with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
        p.terminate()
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)
    with contextlib.suppress(ValueError):
        PROCS.remove(p)
    return p.returncode


def stop_all() -> None:
    for p in PROCS[::-1]:
        with contextlib.suppress(ProcessLookupError):
            p.terminate()
    deadline = time.monotonic() + 10
    for p in PROCS[::-1]:
        stop(p, grace=max(0.1, deadline - time.monotonic()))


def run_cmd(name: str, args: list, timeout: float, env=None, cwd=None, stdin: str | None = None,
            check: bool = True) -> tuple[int, str, str]:
    """Runs a command to completion within `timeout`: (rc, out, err)."""
    p = popen(args, env=env, cwd=cwd, text=True, stdout=subprocess.PIPE,
                    stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                    stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(input=stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{name} did not finish within {timeout:.0f}s")
    finally:
        stop(p, grace=5)
    if check and p.returncode != 0:
        raise BenchError(f"{name} exited {p.returncode}: {(err or out).strip()[-2000:]}")
    return p.returncode, out, err


def read_lines(p: subprocess.Popen, last, timeout: float, buf: bytes = b""):
    """`p`'s lines up to the first `last(line)` accepts, within `timeout`; and the rest read."""
    deadline, lines = time.monotonic() + timeout, []
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            lines.append(line.decode(errors="replace"))
            if last(lines[-1]):
                return lines, buf
        if (left := deadline - time.monotonic()) <= 0:
            raise BenchError(f"no expected output within {timeout:.0f}s (exit {p.poll()}): "
                             f"{lines[-5:]}; see {LOGS}")
        if select.select([p.stdout], [], [], left)[0]:
            if not (chunk := os.read(p.stdout.fileno(), 65536)):
                raise BenchError(f"output ended (exit {p.poll()}): {lines[-5:]}; see {LOGS}")
            buf += chunk


def http(url: str, post: bool = False, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=b"" if post else None, method="POST" if post else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_ready(url: str, p: subprocess.Popen, name: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and p.poll() is None:
        with contextlib.suppress(OSError):
            if http(url, timeout=2)[0] == 200:
                return
        time.sleep(0.1)
    raise BenchError(f"{name} not ready at {url} (exit {p.poll()}); see {LOGS}")


def read_stat(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields from the 3rd (state) on: [1] ppid, [11] utime, [12] stime,
    [13] cutime, [14] cstime, [19] starttime."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_cpu_secs(pid: int) -> float:
    f = read_stat(pid)
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK") if f else 0.0


def clean_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not PRODUCT_VARS.match(k) and k != "DATABASE_URL"}
    return {**env, **{k: str(v) for k, v in (extra or {}).items()}}


def hlabel(n: int) -> str:
    """1000000 -> "1m", 500000 -> "500k": the history sizes in key names."""
    return f"{n // 1_000_000}m" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k"


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return round(v[min(len(v) - 1, max(0, round(p / 100.0 * len(v) + 0.5) - 1))], 2)


def ratio(a, b) -> float | None:
    return None if a is None or not b else round(a / b, 3)
