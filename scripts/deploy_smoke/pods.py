"""One workload of the render (a Deployment, one replica; or the Job), run
by `podman kube play`, and what the smoke does in the kubelet's place where
podman 4.3 does not (shims 3 to 7 of the package docstring)."""

from __future__ import annotations

import copy
import http.client
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from ports import free_port

from .manifests import Render, SmokeFailure

LABEL = "webhooks.deploy-smoke"
# A network namespace per pod, like a cluster's, from which the host's
# loopback (the smoke's Postgres, the downstream) is 10.0.2.2.
NETWORK = "slirp4netns:allow_host_loopback=true"


def podman(*args: str, check: bool = True, timeout: float = 120, stdin: str | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *args], input=stdin, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise SmokeFailure(f"podman {' '.join(args[:2])}: {(done.stderr or done.stdout).strip()}")
    return done


def remove_leftovers(key: str) -> int:
    """Pods an interrupted run of this checkout left."""
    ids = podman("pod", "ps", "-q", "--filter", f"label={LABEL}={key}").stdout.split()
    for i in ids:
        podman("pod", "rm", "-f", "-t", "0", i, check=False)
    return len(ids)


def indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


@dataclass
class Probe:
    kind: str
    path: str
    port: int  # the container's (a named port resolved)
    timeout: float
    period: float
    failure_threshold: int
    success_threshold: int

    @classmethod
    def of(cls, kind: str, spec: dict | None, named: dict[str, int]) -> Probe | None:
        if spec is None:
            return None
        if set(spec) & {"exec", "tcpSocket", "grpc"}:
            raise SmokeFailure(f"a {kind} probe other than httpGet is not reproduced here: teach pods.py")
        port = spec["httpGet"]["port"]
        return cls(kind, spec["httpGet"].get("path", "/"), named.get(port, port) if isinstance(port, str) else port,
                   spec.get("timeoutSeconds", 1), spec.get("periodSeconds", 10),
                   spec.get("failureThreshold", 3), spec.get("successThreshold", 1))

    def __str__(self) -> str:
        return f"GET :{self.port}{self.path}, timeout {self.timeout} s"


class Workload:
    def __init__(self, render: Render, kind: str, name: str, key: str, workdir: Path) -> None:
        self.render, self.kind, self.name, self.key = render, kind, name, key
        self.owner = f"{kind}/{name}"
        self.obj = render.get(kind, name)
        self.spec = self.obj["spec"]["template"]["spec"]
        if len(self.spec["containers"]) != 1 or self.spec.get("initContainers"):
            raise SmokeFailure(f"{self.owner}: one container per pod is reproduced here: teach pods.py")
        self.c = self.spec["containers"][0]
        named = {p["name"]: p["containerPort"] for p in self.c.get("ports") or [] if p.get("name")}
        self.readiness = Probe.of("readiness", self.c.get("readinessProbe"), named)
        self.liveness = Probe.of("liveness", self.c.get("livenessProbe"), named)
        self.sc = {**(self.spec.get("securityContext") or {}), **(self.c.get("securityContext") or {})}
        self.grace = int(self.spec.get("terminationGracePeriodSeconds", 30))
        hook = (self.c.get("lifecycle") or {}).get("preStop") or {}
        if set(hook) - {"sleep"}:
            raise SmokeFailure(f"{self.owner}: a preStop hook other than sleep is not reproduced here: teach pods.py")
        self.pre_stop = float(hook["sleep"]["seconds"]) if hook else 0.0
        self.file = workdir / f"{name}.yaml"
        self.log = workdir / f"{name}.log"
        self.ports: dict[int, int] = {}  # container port -> 127.0.0.1 port
        self.pod = self.ctr = ""

    def playable(self) -> list[dict]:
        """What `podman kube play` gets: the render's ConfigMaps and this
        workload, as podman 4.3 can run it."""
        obj = copy.deepcopy(self.obj)
        if self.kind == "Job":
            # Shim 3: podman 4.3 plays no Job. Its pod template as a Pod
            # (restartPolicy Never), waited for to exit 0.
            t = obj["spec"]["template"]
            obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {**t.get("metadata", {}), "name": self.name},
                   "spec": t["spec"]}
            template = obj
        else:
            template = obj["spec"]["template"]
        template.setdefault("metadata", {}).setdefault("labels", {})[LABEL] = self.key
        c = template["spec"]["containers"][0]
        # Shim 4: podman 4.3 turns a liveness probe into a healthcheck that
        # runs curl inside the container (distroless has none; a named port
        # becomes port 0) under systemd timers, and ignores readiness. Taken
        # out; the smoke probes from the host as the kubelet does.
        for k in ("livenessProbe", "readinessProbe", "startupProbe"):
            c.pop(k, None)
        # Shim 5: podman 4.3 publishes a containerPort on the host at the
        # same number (two pods of one Deployment would both take it), and a
        # pod on slirp4netns has no address the host reaches. Each
        # containerPort, and each port a probe names (a kubelet probes any
        # port of the pod's IP), is published on 127.0.0.1 at a free port:
        # the smoke's view of the pod's IP.
        ports = c.setdefault("ports", [])
        declared = {p["containerPort"]: p for p in ports}
        wanted = set(declared) | {p.port for p in (self.readiness, self.liveness) if p}
        self.ports = {port: free_port() for port in sorted(wanted)}
        for port, host in self.ports.items():
            if port not in declared:
                ports.append(declared.setdefault(port, {"containerPort": port}))
            declared[port].update(hostPort=host, hostIP="127.0.0.1")
        return self.render.of_kind("ConfigMap") + [obj]

    def play(self, images: dict) -> None:
        self.kubelet_non_root()
        self.file.write_text(yaml.safe_dump_all(self.playable()))
        # No --replace: a pod of the same name that is not the smoke's is
        # not removed (the smoke's own leftovers are, by their label).
        done = podman("kube", "play", "--network", NETWORK, str(self.file), check=False)
        words = done.stdout.split()
        if done.returncode != 0 or "Container:" not in words:
            raise SmokeFailure(f"{self.owner}: podman kube play: {(done.stderr or done.stdout).strip()}")
        # It prints "Pod:\n<id>\nContainer:\n<id>".
        self.pod, self.ctr = words[words.index("Pod:") + 1], words[words.index("Container:") + 1]
        image = self.inspect()["Image"]
        if image not in {i["id"] for i in images["images"].values()}:
            raise SmokeFailure(f"{self.owner} runs {self.c['image']} ({image[:12]}), which make images did not build")

    def kubelet_non_root(self) -> None:
        """Shim 6: podman 4.3 ignores runAsNonRoot. The kubelet refuses to
        start a container that would run as root under it, or whose image's
        user is not a number (CreateContainerConfigError)."""
        if not self.sc.get("runAsNonRoot"):
            return
        user = self.sc.get("runAsUser")
        if user is None:
            user = podman("image", "inspect", "--format", "{{.Config.User}}", self.c["image"]).stdout.strip().split(":")[0]
            if not user.isdigit():
                raise SmokeFailure(f"{self.owner}: CreateContainerConfigError: runAsNonRoot and the image's "
                                   f"user ({user or 'none: root'}) is not numeric")
        if int(user) == 0:
            raise SmokeFailure(f"{self.owner}: CreateContainerConfigError: container's runAsUser breaks non-root "
                               f"policy (runAsNonRoot with runAsUser={user}; podman would have run it as root)")

    def inspect(self) -> dict:
        # Podman 4.3 can fail to inspect a container that is being restarted
        # ("read /proc/<pid>/cgroup: no such process"): asked again.
        for _ in range(20):
            done = podman("container", "inspect", self.ctr, check=False)
            if done.returncode == 0:
                return json.loads(done.stdout)[0]
            time.sleep(0.1)
        raise SmokeFailure(f"podman container inspect {self.ctr}: {done.stderr.strip()}")

    def logs(self, tail: int = 0) -> str:
        done = subprocess.run(["podman", "logs", self.ctr], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=60)
        return "\n".join(done.stdout.splitlines()[-tail:])

    def alive(self) -> None:
        """What the kubelet reports once the container has exited. Podman
        restarts it under restartPolicy Always, and its inspect shows the
        exit code only between two restarts: the first `died` event has it."""
        i = self.inspect()
        if i["State"]["Status"] == "running" and not i["RestartCount"]:
            return
        died = podman("events", "--stream=false", "--filter", f"container={i['Id']}", "--filter", "event=died",
                      "--format", "{{.ContainerExitCode}}").stdout.split()
        if died or i["State"]["Status"] in ("exited", "stopped"):
            code = died[0] if died else i["State"]["ExitCode"]
            raise SmokeFailure(f"{self.owner}: the container exited with {code} (CrashLoopBackOff); "
                               f"its last lines:\n" + indent(self.logs(15)))

    def probe(self, p: Probe) -> tuple[bool, str]:
        """One probe as a kubelet makes it: a 2xx or 3xx within the timeout."""
        conn = http.client.HTTPConnection("127.0.0.1", self.ports[p.port], timeout=p.timeout)
        try:
            conn.request("GET", p.path, headers={"User-Agent": "kube-probe/1.30"})
            resp = conn.getresponse()
            return 200 <= resp.status < 400, f"HTTP {resp.status} {resp.read(200).decode(errors='replace').strip()}"
        except (OSError, http.client.HTTPException) as e:
            return False, f"{type(e).__name__}: {e}"
        finally:
            conn.close()

    def wait(self, p: Probe, passing: bool, timeout: float) -> float:
        """Seconds until the probe passed successThreshold times in a row
        (passing) or failed failureThreshold times (not passing). Polled every
        0.25 s: the outcome is checked, not the kubelet's schedule."""
        t0 = time.monotonic()
        in_a_row, last = 0, "none yet"
        while time.monotonic() - t0 < timeout:
            self.alive()
            ok, last = self.probe(p)
            in_a_row = in_a_row + 1 if ok == passing else 0
            if in_a_row >= (p.success_threshold if passing else p.failure_threshold):
                return time.monotonic() - t0
            time.sleep(0.25)
        state = {("readiness", True): "Ready", ("readiness", False): "unready",
                 ("liveness", True): "live", ("liveness", False): "failing liveness"}[(p.kind, passing)]
        raise SmokeFailure(f"{self.owner}: not {state} after {timeout:.0f} s: {p.kind} probe {p}; last answer: {last}")

    def verify(self) -> str:
        """The manifest's settings as the process got them (/proc): what
        podman applied and what it may have dropped in silence."""
        pid = self.inspect()["State"]["Pid"]
        proc = Path(f"/proc/{pid}")
        status = dict(line.split(":\t", 1) for line in (proc / "status").read_text().splitlines() if ":\t" in line)
        environ = dict(x.split("=", 1) for x in (proc / "environ").read_bytes().decode().split("\0") if "=" in x)
        root = next(line.split()[5] for line in (proc / "mountinfo").read_text().splitlines() if line.split()[4] == "/")
        sc, problems = self.sc, []
        uid, gid = int(status["Uid"].split()[1]), int(status["Gid"].split()[1])
        if sc.get("runAsUser") not in (None, uid) or sc.get("runAsGroup") not in (None, gid):
            problems.append(f"uid:gid {uid}:{gid}, not {sc.get('runAsUser')}:{sc.get('runAsGroup')}")
        drop, add = (sc.get("capabilities") or {}).get("drop") or [], (sc.get("capabilities") or {}).get("add")
        if "ALL" in drop and not add and int(status["CapEff"], 16) | int(status["CapBnd"], 16):
            problems.append("capabilities left")
        if sc.get("allowPrivilegeEscalation") is False and status["NoNewPrivs"].strip() != "1":
            problems.append("no_new_privs not set")
        if bool(sc.get("readOnlyRootFilesystem")) != ("ro" in root.split(",")):
            problems.append(f"root mounted {root}")
        if (sc.get("seccompProfile") or {}).get("type") == "RuntimeDefault" and status["Seccomp"].strip() != "2":
            problems.append("no seccomp filter")
        memory = (self.c.get("resources") or {}).get("limits", {}).get("memory")
        if memory and self.inspect()["HostConfig"]["Memory"] != quantity(memory):
            problems.append(f"memory limit not {memory}")
        if status["NSpid"].split()[-1] != "1":
            problems.append("the binary is not PID 1 (SIGTERM would not reach it)")
        want = self.render.env(self.c, self.inspect()["Config"]["Hostname"])
        wrong = sorted(k for k, v in want.items() if environ.get(k) != v)
        if wrong:
            problems.append(f"environment differs from the manifest's in {wrong}")
        if problems:
            raise SmokeFailure(f"{self.owner}: the process did not get its settings: " + "; ".join(problems))
        return (f"{self.owner} as it runs (/proc): uid {uid}:{gid}, capabilities none, no_new_privs, seccomp, "
                f"/ {'read-only' if 'ro' in root.split(',') else 'writable'}, PID 1, memory {memory}, "
                f"the manifest's {len(want)} variables")

    def stop(self) -> float:
        """The kubelet's termination: the preStop sleep, SIGTERM, SIGKILL once
        the grace period is spent. Shim 7: podman 4.3 runs no lifecycle hook
        and stops after 10 s whatever terminationGracePeriodSeconds says; the
        smoke sleeps, then `podman stop -t <the rest of the grace>` of the
        container alone: `podman pod stop` would stop the infra container at
        the same time, and with it the pod's network under calls in flight
        (a kubelet removes the sandbox last)."""
        self.alive()
        t0 = time.monotonic()
        time.sleep(min(self.pre_stop, self.grace))
        left = max(2, round(self.grace - (time.monotonic() - t0)))
        t1 = time.monotonic()
        podman("stop", "-t", str(left), self.ctr, timeout=left + 60)
        secs = time.monotonic() - t1
        code = self.inspect()["State"]["ExitCode"]
        if code != 0:
            raise SmokeFailure(f"{self.owner}: exit code {code} after SIGTERM ("
                               f"{'killed at the end of the grace period' if code == 137 else 'not a clean exit'}); "
                               f"its last lines:\n" + indent(self.logs(15)))
        return secs

    def run_to_completion(self) -> int:
        """The Job's pod: its exit code, within activeDeadlineSeconds."""
        deadline = min(self.obj["spec"].get("activeDeadlineSeconds", 300), 300)
        try:
            done = podman("wait", self.ctr, timeout=deadline)
        except subprocess.TimeoutExpired:
            raise SmokeFailure(f"{self.owner}: DeadlineExceeded: still running after {deadline} s") from None
        return int(done.stdout.split()[-1])

    def down(self) -> None:
        """The pod removed, by its id (a play that failed half way leaves a
        pod with no id known here: Smoke.cleanup removes it by its label)."""
        if self.ctr:
            self.log.write_text(self.logs())
        if self.pod:
            podman("pod", "rm", "-f", "-t", "0", self.pod, check=False)


def quantity(q: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if q.endswith(suffix):
            return int(float(q[: -len(suffix)]) * factor)
    return int(q)
