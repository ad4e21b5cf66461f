"""What every phase uses: the registry of processes (each one started is
stopped at exit), commands run to completion, HTTP, the CPU and memory
meters, percentiles and ratios."""

from __future__ import annotations

import contextlib
import os
import re
import select
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from .config import LOGS, PRODUCT_VARS, BenchError


class Procs:
    def __init__(self) -> None:
        self.items: list[subprocess.Popen] = []
        self.lock = threading.Lock()

    def popen(self, args: list, **kw) -> subprocess.Popen:
        # Own session: a Ctrl-C reaches only this script, which then stops
        # its children in order (SIGTERM, then SIGKILL after a grace period).
        p = subprocess.Popen([str(a) for a in args], start_new_session=True, **kw)
        with self.lock:
            self.items.append(p)
        return p

    def stop(self, p: subprocess.Popen, grace: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace` seconds."""
        with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
            p.terminate()
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        with self.lock:
            self.items = [q for q in self.items if q is not p]
        return p.returncode

    def stop_all(self) -> None:
        for p in self.items[::-1]:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
        deadline = time.monotonic() + 10
        for p in self.items[::-1]:
            self.stop(p, grace=max(0.1, deadline - time.monotonic()))


PROCS = Procs()


def run_cmd(name: str, args: list, timeout: float, env: dict | None = None, cwd=None,
            stdin: str | None = None, check: bool = True) -> tuple[int, str, str]:
    """Runs a command to completion (bounded by `timeout`); returns (rc, out, err)."""
    p = PROCS.popen(args, env=env, cwd=cwd, text=True, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(input=stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{name} did not finish within {timeout:.0f}s")
    finally:
        PROCS.stop(p, grace=5)
    if check and p.returncode != 0:
        raise BenchError(f"{name} exited {p.returncode}: {(err or out).strip()[-2000:]}")
    return p.returncode, out, err


def read_lines(p: subprocess.Popen, last, timeout: float, buf: bytes = b"") -> tuple[list[str], bytes]:
    """Lines of `p`'s output up to the first that `last(line)` accepts, read
    within `timeout`; and what was read beyond it."""
    deadline, lines = time.monotonic() + timeout, []
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            lines.append(line.decode(errors="replace"))
            if last(lines[-1]):
                return lines, buf
        if (left := deadline - time.monotonic()) <= 0:
            raise BenchError(f"no expected output within {timeout:.0f}s (exit {p.poll()}): {lines[-5:]}; see {LOGS}")
        if select.select([p.stdout], [], [], left)[0]:
            if not (chunk := os.read(p.stdout.fileno(), 65536)):
                raise BenchError(f"the process ended its output (exit {p.poll()}): {lines[-5:]}; see {LOGS}")
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
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise BenchError(f"{name} exited ({p.returncode}) before it was ready; see {LOGS}")
        with contextlib.suppress(OSError):
            if http(url, timeout=2)[0] == 200:
                return
        time.sleep(0.1)
    raise BenchError(f"{name} not ready at {url} within {timeout:.0f}s; see {LOGS}")


def peak_rss_mib(pid: int) -> float | None:
    """Peak resident memory (VmHWM) of a live process."""
    with contextlib.suppress(OSError):
        m = re.search(r"^VmHWM:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M)
        return round(int(m.group(1)) / 1024, 1) if m else None


def read_stat(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields from the 3rd (state) on: [1] ppid, [11] utime,
    [12] stime, [13] cutime, [14] cstime, [19] starttime."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_cpu_secs(pid: int) -> float | None:
    f = read_stat(pid)
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK") if f else None


class CpuMeter:
    """The machine's CPU use (all processes) from its creation to `cores_busy()`, in cores."""

    @staticmethod
    def _read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        return sum(fields) - fields[3] - fields[4], sum(fields)  # busy (all but idle and iowait), total

    def __init__(self) -> None:
        self.busy0, self.total0 = self._read()

    def cores_busy(self) -> float:
        busy, total = self._read()
        return round((busy - self.busy0) / max(total - self.total0, 1) * (os.cpu_count() or 1), 2)


def clean_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not PRODUCT_VARS.match(k) and k != "DATABASE_URL"}
    return {**env, **{k: str(v) for k, v in (extra or {}).items()}}


def hlabel(n: int) -> str:
    """1000000 -> "1m", 500000 -> "500k": the history sizes in key names."""
    return f"{n // 1_000_000}m" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k"


def pct(values: list[float], p: float) -> float | None:
    v = sorted(values)
    return round(v[min(len(v) - 1, max(0, int(round(p / 100.0 * len(v) + 0.5)) - 1))], 2) if v else None


def ratio(a, b) -> float | None:
    return None if a is None or not b else round(a / b, 3)
