"""What every phase uses: the registry of processes (each one started is
stopped at exit), commands run to completion, HTTP, the CPU and memory
meters, percentiles and ratios."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from .config import LOGS, PRODUCT_VARS, BenchError


class Procs:
    def __init__(self) -> None:
        self.items: list[tuple[str, subprocess.Popen]] = []
        self.lock = threading.Lock()

    def popen(self, name: str, args: list[str], **kw) -> subprocess.Popen:
        # Own session: a Ctrl-C reaches only this script, which then stops
        # its children in order (SIGTERM, then SIGKILL after a grace period).
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen([str(a) for a in args], **kw)
        with self.lock:
            self.items.append((name, p))
        return p

    def stop(self, p: subprocess.Popen, grace: float = 15.0) -> int | None:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                p.kill()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            except ProcessLookupError:
                pass
        with self.lock:
            self.items = [(n, q) for n, q in self.items if q is not p]
        for stream in (p.stdin, p.stdout, p.stderr):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass
        return p.returncode

    def stop_all(self) -> None:
        with self.lock:
            items = list(reversed(self.items))
        for _, p in items:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for _, p in items:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        for _, p in items:
            self.stop(p, grace=1)


PROCS = Procs()


def run_cmd(name: str, args: list, timeout: float, env: dict | None = None, cwd=None,
            stdin: str | None = None, check: bool = True) -> tuple[int, str, str]:
    """Runs a command to completion (bounded by `timeout`); returns (rc, out, err)."""
    p = PROCS.popen(name, args, env=env, cwd=cwd, text=True,
                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(input=stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        PROCS.stop(p, grace=5)
        raise BenchError(f"{name} did not finish within {timeout:.0f}s")
    finally:
        if p.poll() is not None:
            PROCS.stop(p)
    if check and p.returncode != 0:
        raise BenchError(f"{name} exited {p.returncode}: {(err or out).strip()[-2000:]}")
    return p.returncode, out, err


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_post(url: str, body: bytes = b"", timeout: float = 5.0) -> int:
    req = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def wait_ready(url: str, p: subprocess.Popen, name: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise BenchError(f"{name} exited ({p.returncode}) before it was ready; see {LOGS}")
        try:
            if http_get(url, timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise BenchError(f"{name} not ready at {url} within {timeout:.0f}s; see {LOGS}")


def rss_mib(pid: int) -> dict:
    """Peak (VmHWM) and current (VmRSS) resident memory of a live process."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmHWM:", "VmRSS:")):
                key, value = line.split(":", 1)
                out[key] = round(int(value.split()[0]) / 1024, 1)
    except OSError:
        pass
    return {"peak_mib": out.get("VmHWM"), "current_mib": out.get("VmRSS")}


def proc_cpu_secs(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class CpuMeter:
    """The machine's CPU use (all processes) between start and stop, in cores."""

    @staticmethod
    def _read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]
        return sum(fields[:8]) - idle, sum(fields[:8])

    def __init__(self) -> None:
        self.busy0, self.total0 = self._read()
        self.t0 = time.monotonic()

    def cores_busy(self) -> float:
        busy, total = self._read()
        if total == self.total0:
            return 0.0
        return round((busy - self.busy0) / (total - self.total0) * (os.cpu_count() or 1), 2)


def clean_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not PRODUCT_VARS.match(k)}
    env.pop("DATABASE_URL", None)
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def hlabel(n: int) -> str:
    """1000000 -> "1m", 500000 -> "500k": the history sizes in key names."""
    return f"{n // 1_000_000}m" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k"


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    k = min(len(v) - 1, max(0, int(round(p / 100.0 * len(v) + 0.5)) - 1))
    return round(v[k], 2)


def ratio(a, b) -> float | None:
    if a is None or not b:
        return None
    return round(a / b, 3)
