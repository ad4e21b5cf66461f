"""What a kubelet does to a running container, with the manifest's numbers:
probe it (every periodSeconds, timeoutSeconds each, Ready after
successThreshold successes, unready or restarted after failureThreshold
failures), and stop it (the preStop hook, then SIGTERM, then SIGKILL when
terminationGracePeriodSeconds is spent)."""

from __future__ import annotations

import http.client
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field

from .objects import SmokeFailure
from .pod import Probe
from .podman import Running, podman


def probe_once(p: Probe, port: int) -> tuple[bool, str]:
    """One probe as the kubelet makes it: success is a 2xx or 3xx answer
    within the timeout (httpGet) or a connection accepted (tcpSocket)."""
    try:
        if p.path is None:
            with socket.create_connection(("127.0.0.1", port), timeout=p.timeout):
                return True, "connected"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=p.timeout)
        try:
            conn.request("GET", p.path, headers={"User-Agent": "kube-probe/1.30", "Accept": "*/*", **p.headers})
            resp = conn.getresponse()
            body = resp.read(200).decode(errors="replace").strip()
            return 200 <= resp.status < 400, f"HTTP {resp.status} {body}"
        finally:
            conn.close()
    except (OSError, http.client.HTTPException) as e:
        return False, f"{type(e).__name__}: {e}"


@dataclass
class Prober:
    """One probe of one container, run on the kubelet's schedule in a thread."""
    probe: Probe
    port: int  # the published port for probe.port
    started: float
    ready: bool = False  # readiness: the Ready condition; liveness: unused
    failures_in_a_row: int = 0
    successes_in_a_row: int = 0
    failures: int = 0
    restarts_due: list[float] = field(default_factory=list)  # liveness: when the kubelet would restart
    transitions: list[tuple[float, bool, str]] = field(default_factory=list)
    last: str = ""

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self._stop.wait(self.probe.initial_delay):
            return
        while True:
            at = time.monotonic()
            ok, detail = probe_once(self.probe, self.port)
            # The kubelet acts on a result when it has it.
            answered = time.monotonic() - self.started
            with self._changed:
                self.last = detail
                if ok:
                    self.successes_in_a_row += 1
                    self.failures_in_a_row = 0
                    if not self.ready and self.successes_in_a_row >= self.probe.success_threshold:
                        self.ready = True
                        self.transitions.append((answered, True, detail))
                else:
                    self.failures += 1
                    self.failures_in_a_row += 1
                    self.successes_in_a_row = 0
                    if self.failures_in_a_row >= self.probe.failure_threshold:
                        if self.probe.kind == "liveness":
                            self.restarts_due.append(answered)
                            self.failures_in_a_row = 0
                        elif self.ready:
                            self.ready = False
                            self.transitions.append((answered, False, detail))
                self._changed.notify_all()
            if self._stop.wait(max(0.0, self.probe.period - (time.monotonic() - at))):
                return

    def stop(self) -> None:
        self._stop.set()

    def wait_for(self, ready: bool, timeout: float, alive) -> float:
        """Seconds since the container started when the condition became
        `ready`; SmokeFailure after timeout, or as soon as alive() raises."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                if self.ready == ready and self.transitions and self.transitions[-1][1] == ready:
                    return self.transitions[-1][0]
                left = deadline - time.monotonic()
                if left <= 0:
                    want = "Ready" if ready else "unready"
                    raise SmokeFailure(f"not {want} {time.monotonic() - self.started:.0f} s after the start: {self.probe.kind} probe "
                                       f"{self.probe.describe()}; last answer: {self.last or 'none yet'}")
                self._changed.wait(min(left, 0.5))
                alive()


class Pod:
    """A started container and the kubelet's probers on it."""

    def __init__(self, running: Running, started: float) -> None:
        self.running = running
        self.c = running.container
        self.started = started
        self.readiness = self._prober(self.c.readiness)
        self.liveness = self._prober(self.c.liveness)

    def _prober(self, p: Probe | None) -> Prober | None:
        return Prober(p, self.running.host_ports[p.port], self.started) if p else None

    def alive(self) -> None:
        """Raises what the kubelet would report once the container has exited
        or failed its liveness probe."""
        code = self.running.exited()
        if code is not None:
            raise SmokeFailure(f"{self.c.owner}: the container exited with {code} (CrashLoopBackOff); its last lines:\n"
                               + indent(self.running.logs(tail=15)))
        if self.liveness and self.liveness.restarts_due:
            raise SmokeFailure(f"{self.c.owner}: liveness failed {self.c.liveness.failure_threshold} times in a row "
                               f"({self.liveness.last}): the kubelet would restart it")

    def wait_ready(self, timeout: float) -> float:
        if self.readiness is None:
            self.alive()
            return 0.0
        return self._wait(True, timeout)

    def wait_unready(self, timeout: float) -> float:
        if self.readiness is None:
            raise SmokeFailure(f"{self.c.owner} has no readiness probe")
        return self._wait(False, timeout)

    def _wait(self, ready: bool, timeout: float) -> float:
        try:
            return self.readiness.wait_for(ready, timeout, self.alive)
        except SmokeFailure as e:
            if str(e).startswith(self.c.owner):
                raise
            raise SmokeFailure(f"{self.c.owner}: {e}") from None

    def stop_probing(self) -> None:
        for p in (self.readiness, self.liveness):
            if p:
                p.stop()

    def first_ready(self, timeout: float) -> float:
        """Seconds from `podman run` to the first successful readiness answer,
        polled every 20 ms: the image's cold start, which a kubelet sees at
        its next probe."""
        p = self.c.readiness
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            ok, _ = probe_once(p, self.running.host_ports[p.port])
            if ok:
                return time.monotonic() - self.started
            self.alive()
            time.sleep(0.02)
        return float("nan")


@dataclass
class Stopped:
    exit_code: int
    pre_stop_secs: float
    after_sigterm_secs: float
    grace_secs: int
    killed: bool


def terminate(pod: Pod, on_pre_stop=None, after_sigterm=None) -> Stopped:
    """The kubelet's killContainer: the preStop hook (within the grace
    period), then SIGTERM, and SIGKILL once the rest of the grace period is
    spent (at least 2 s after the hook, as the kubelet grants).

    on_pre_stop() runs 1.5 s before a preStop sleep ends (else before the
    hook), after_sigterm() right after SIGTERM is sent: what the smoke does
    to the container meanwhile."""
    c = pod.c
    t0 = time.monotonic()
    h = c.pre_stop
    if h is not None and h.sleep is not None:
        pause = min(h.sleep, c.grace_seconds)
        time.sleep(max(0.0, pause - 1.5))
        if on_pre_stop:
            on_pre_stop()
        time.sleep(max(0.0, pause - (time.monotonic() - t0)))
    else:
        if on_pre_stop:
            on_pre_stop()
        if h is not None and h.exec_command is not None:
            done = podman("exec", pod.running.name, *h.exec_command, check=False, timeout=c.grace_seconds)
            if done.returncode != 0:
                raise SmokeFailure(f"{c.owner}: FailedPreStopHook: exec {h.exec_command}: "
                                   f"{(done.stderr or done.stdout).strip()}")
        elif h is not None:
            url = f"http://127.0.0.1:{pod.running.host_ports[h.http_port]}{h.http_path}"
            try:
                urllib.request.urlopen(url, timeout=c.grace_seconds).read()
            except OSError as e:
                raise SmokeFailure(f"{c.owner}: FailedPreStopHook: GET {h.http_path}: {e}") from e
    pre = time.monotonic() - t0
    remaining = max(2, round(c.grace_seconds - pre))
    t1 = time.monotonic()
    stop = subprocess.Popen(["podman", "stop", "-t", str(remaining), pod.running.name],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if after_sigterm:
        after_sigterm()
    _, err = stop.communicate(timeout=remaining + 30)
    if stop.returncode != 0:
        raise SmokeFailure(f"podman stop {pod.running.name}: {err.strip()}")
    after = time.monotonic() - t1
    pod.stop_probing()
    code = pod.running.state()["ExitCode"]
    return Stopped(code, pre, after, c.grace_seconds, killed=code == 137 or after >= remaining)


def run_to_completion(running: Running, deadline: float | None) -> tuple[int, float]:
    """A Job's container (restartPolicy Never): its exit code and run time."""
    t0 = time.monotonic()
    timeout = deadline or 600
    try:
        done = podman("wait", running.name, timeout=timeout)
    except subprocess.TimeoutExpired:
        podman("stop", "-t", "0", running.name, check=False)
        raise SmokeFailure(f"{running.container.owner}: DeadlineExceeded: still running after {timeout} s "
                           "(activeDeadlineSeconds)") from None
    return int(done.stdout.strip().splitlines()[-1]), time.monotonic() - t0


def indent(text: str, by: str = "    ") -> str:
    return "\n".join(by + line for line in text.rstrip().splitlines())
