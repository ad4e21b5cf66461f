"""The render, and one workload of it (a Deployment, one replica; or the Job)
under `podman kube play`, with the shim: what podman 4.3 cannot do, done here
(each item says why where it is done, as "Shim N").
1. Secrets: the overlay's example (no kustomization lists them), REPLACE_ME
   filled, each made with `podman secret create`.
2. Addresses: no cluster DNS and no StatefulSet: a URL to the Service
   `postgres` goes to the smoke's own Postgres, the overlay's `.invalid` APIs
   to the simulated downstream, both on the host's loopback.
3. The Job: its pod template played as a Pod, waited for.
4. Probes: taken out of the played YAML; the smoke probes from the host.
5. Ports: each one published on 127.0.0.1 at a free port.
6. runAsNonRoot: the kubelet's check.
7. preStop and terminationGracePeriodSeconds: the sleep, then `podman stop -t`.
Not reproduced: NetworkPolicy (podman cannot enforce it), kube-proxy (the
smoke follows the Service's selector and targetPort itself), Pod Security
admission, Service-link variables (the binaries read named variables only),
the scheduler's fields, replicas beyond one."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import os
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from ports import free_port

ROOT = Path(__file__).resolve().parents[2]
WORKDIR = ROOT / "target/deploy-smoke"
# The label of the smoke's pods and secrets, KEY (deploy-smoke.sh's, of the checkout) as its value.
LABEL, KEY = "webhooks.deploy-smoke", os.environ["DEPLOY_SMOKE_KEY"]
# The host's loopback as a pod on slirp4netns (allow_host_loopback) reaches it.
HOST_FROM_POD = "10.0.2.2"
PROBE_DEFAULTS = {"path": "/", "timeoutSeconds": 1, "periodSeconds": 10, "failureThreshold": 3, "successThreshold": 1}


class SmokeFailure(Exception):
    """The smoke failed: the message says what a cluster would have shown."""


def podman(*args: str, check: bool = True, timeout: float = 120, stdin: str | None = None):
    done = subprocess.run(["podman", *args], input=stdin, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise SmokeFailure(f"podman {' '.join(args[:2])}: {(done.stderr or done.stdout).strip()}")
    return done


def remove_pods() -> int:
    """This checkout's pods, by their label: an interrupted run's, or one whose play failed half way."""
    ids = podman("pod", "ps", "-q", "--filter", f"label={LABEL}={KEY}").stdout.split()
    for i in ids:
        podman("pod", "rm", "-f", "-t", "0", i, check=False)
    return len(ids)


def indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


class Render:
    """`kubectl kustomize` of the overlay, and its example Secrets."""

    def __init__(self, kubectl: str, overlay: Path, password: str) -> None:
        done = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise SmokeFailure(f"kubectl kustomize {overlay}: {done.stderr.strip()}")
        self.docs = [d for d in yaml.safe_load_all(done.stdout) if d]
        # Shim 1: no kustomization lists the Secrets; the example's, each
        # REPLACE_ME filled with this run's password, as its comments ask.
        self.secrets: dict[str, dict[str, str]] = {}
        for doc in yaml.safe_load_all((overlay / "secrets.example.yaml").read_text()):
            if doc and doc.get("kind") == "Secret":
                values = doc["stringData"].items()
                self.secrets[doc["metadata"]["name"]] = {k: v.replace("REPLACE_ME", password) for k, v in values}

    def get(self, kind: str, name: str | None = None) -> dict:
        found = [d for d in self.docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
        if len(found) != 1:
            raise SmokeFailure(f"the render has {len(found)} {kind}/{name or '*'}, not one")
        return found[0]

    def stand_ins(self, postgres: int, downstream: int) -> list[str]:
        """Shim 2, in every ConfigMap and Secret value: a URL to the Service
        `postgres` (no cluster DNS; podman plays no StatefulSet) goes to the
        smoke's Postgres; one under `.invalid` (the overlay's placeholder
        APIs) to the simulated downstream. Returns what was changed, with no
        value: some are secret."""
        ns = self.get("Namespace")["metadata"]["name"]
        hosts = {"postgres" + s for s in ("", f".{ns}", f".{ns}.svc", f".{ns}.svc.cluster.local")}
        ports = [p["port"] for p in self.get("Service", "postgres")["spec"]["ports"]]
        notes = set()

        def rewrite(value: str) -> str:
            u = urlsplit(value)
            host, user = u.hostname or "", "".join(u.netloc.rpartition("@")[:2])
            if host in hosts:
                if (u.port or ports[0]) not in ports:
                    raise SmokeFailure(f"a URL names {host}:{u.port}, but the Service postgres serves {ports}")
                notes.add(f"{host}:{u.port or ports[0]} -> {HOST_FROM_POD}:{postgres} (Service postgres)")
                return u._replace(netloc=f"{user}{HOST_FROM_POD}:{postgres}").geturl()
            if host.endswith(".invalid"):
                notes.add(f"{u.scheme}://{host} -> http://{HOST_FROM_POD}:{downstream} (the simulated downstream)")
                return u._replace(scheme="http", netloc=f"{user}{HOST_FROM_POD}:{downstream}").geturl()
            return value

        for cm in (d for d in self.docs if d["kind"] == "ConfigMap"):
            cm["data"] = {k: rewrite(str(v)) for k, v in (cm.get("data") or {}).items()}
        for values in self.secrets.values():
            values.update({k: rewrite(v) for k, v in values.items()})
        return sorted(notes)

    def create_secrets(self) -> None:
        """Shim 1: podman 4.3 stores a played `kind: Secret` as YAML and reads
        it back as JSON ("secret ... is not valid JSON"): each is made with
        `podman secret create`, as the JSON of its base64 values (what
        secretKeyRef reads). One of the same name that the smoke did not make
        (its label) is left alone, and the smoke stops."""
        for name, values in self.secrets.items():
            found = podman("secret", "inspect", "--format", f'{{{{index .Spec.Labels "{LABEL}"}}}}', name, check=False)
            if found.returncode == 0 and found.stdout.strip() != KEY:
                raise SmokeFailure(f"podman has a secret {name} that the smoke did not make: remove or rename it")
            podman("secret", "rm", name, check=False)
            podman("secret", "create", "--label", f"{LABEL}={KEY}", name, "-",
                   stdin=json.dumps({k: base64.b64encode(v.encode()).decode() for k, v in values.items()}))


class Workload:
    def __init__(self, render: Render, kind: str, name: str) -> None:
        self.render, self.kind, self.name = render, kind, name
        self.owner = f"{kind}/{name}"
        self.obj = render.get(kind, name)
        spec = self.obj["spec"]["template"]["spec"]
        if len(spec["containers"]) != 1 or spec.get("initContainers"):
            raise SmokeFailure(f"{self.owner}: one container per pod is reproduced here: teach pods.py")
        self.c = spec["containers"][0]
        self.named_ports = {p.get("name"): p["containerPort"] for p in self.c.get("ports") or []}
        self.readiness, self.liveness = self.probe_of("readiness"), self.probe_of("liveness")
        self.sc = {**(spec.get("securityContext") or {}), **(self.c.get("securityContext") or {})}
        self.grace = int(spec.get("terminationGracePeriodSeconds", 30))
        hook = (self.c.get("lifecycle") or {}).get("preStop") or {}
        if set(hook) - {"sleep"}:
            raise SmokeFailure(f"{self.owner}: a preStop hook other than sleep is not reproduced here: teach pods.py")
        self.pre_stop = float(hook["sleep"]["seconds"]) if hook else 0.0
        self.ports: dict[int, int] = {}  # container port -> 127.0.0.1 port
        self.pod = self.ctr = ""

    def probe_of(self, kind: str) -> dict | None:
        spec = self.c.get(f"{kind}Probe")
        if not spec:
            return None
        if "httpGet" not in spec:
            raise SmokeFailure(f"{self.owner}: a {kind} probe other than httpGet is not reproduced here: teach pods.py")
        port = spec["httpGet"]["port"]
        return {**PROBE_DEFAULTS, **spec, **spec["httpGet"], "kind": kind,
                "port": self.named_ports.get(port) if isinstance(port, str) else port}

    def playable(self) -> list[dict]:
        """What `podman kube play` gets: the ConfigMaps and this workload, as podman 4.3 can run it."""
        obj = copy.deepcopy(self.obj)
        if self.kind == "Job":
            # Shim 3: podman 4.3 plays no Job. Its pod template as a Pod
            # (restartPolicy Never), waited for to exit 0.
            t = obj["spec"]["template"]
            obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {**t.get("metadata", {}), "name": self.name},
                   "spec": t["spec"]}
        template = obj if self.kind == "Job" else obj["spec"]["template"]
        template.setdefault("metadata", {}).setdefault("labels", {})[LABEL] = KEY
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
        declared = {p["containerPort"]: p for p in c.setdefault("ports", [])}
        wanted = set(declared) | {p["port"] for p in (self.readiness, self.liveness) if p}
        self.ports = {port: free_port() for port in sorted(wanted)}
        for port, host in self.ports.items():
            if port not in declared:
                c["ports"].append(declared.setdefault(port, {"containerPort": port}))
            declared[port].update(hostPort=host, hostIP="127.0.0.1")
        return [d for d in self.render.docs if d["kind"] == "ConfigMap"] + [obj]

    def play(self) -> None:
        self.kubelet_non_root()
        played = WORKDIR / f"{self.name}.yaml"
        played.write_text(yaml.safe_dump_all(self.playable()))
        # A network namespace per pod, as in a cluster, from which the host's
        # loopback is 10.0.2.2. No --replace: a pod of the same name that is
        # not the smoke's is not removed (the smoke's own are, by their label).
        done = podman("kube", "play", "--network", "slirp4netns:allow_host_loopback=true", str(played), check=False)
        words = done.stdout.split()
        if done.returncode != 0 or "Container:" not in words:
            raise SmokeFailure(f"{self.owner}: podman kube play: {(done.stderr or done.stdout).strip()}")
        # It prints "Pod:\n<id>\nContainer:\n<id>".
        self.pod, self.ctr = words[words.index("Pod:") + 1], words[words.index("Container:") + 1]
        image = self.inspect()["Image"]
        built = {f.read_text().strip().removeprefix("sha256:") for f in (ROOT / "target/images").glob("*.iid")}
        if image not in built:
            raise SmokeFailure(f"{self.owner} runs {self.c['image']} ({image[:12]}), which make images did not build")

    def kubelet_non_root(self) -> None:
        """Shim 6: podman 4.3 ignores runAsNonRoot. The kubelet refuses to
        start a container that would run as root under it, or whose image's
        user is not a number (CreateContainerConfigError)."""
        if not self.sc.get("runAsNonRoot"):
            return
        user = str(self.sc.get("runAsUser", ""))
        if not user:
            user = podman("image", "inspect", "--format", "{{.Config.User}}", self.c["image"]).stdout.strip()
            user = user.split(":")[0]
        if not user.isdigit() or int(user) == 0:
            raise SmokeFailure(f"{self.owner}: CreateContainerConfigError: container's runAsUser breaks non-root "
                               f"policy (runAsNonRoot with runAsUser={user or 'none: root'})")

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

    def environ(self) -> dict[str, str]:
        environ = Path(f"/proc/{self.inspect()['State']['Pid']}/environ").read_bytes().decode()
        return dict(x.split("=", 1) for x in environ.split("\0") if "=" in x)

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

    def probe(self, p: dict) -> tuple[bool, str]:
        """One probe as a kubelet makes it: a 2xx or 3xx within the timeout."""
        conn = http.client.HTTPConnection("127.0.0.1", self.ports[p["port"]], timeout=p["timeoutSeconds"])
        try:
            conn.request("GET", p["path"])
            resp = conn.getresponse()
            return 200 <= resp.status < 400, f"HTTP {resp.status} {resp.read(200).decode(errors='replace').strip()}"
        except (OSError, http.client.HTTPException) as e:
            return False, f"{type(e).__name__}: {e}"
        finally:
            conn.close()

    def wait(self, p: dict, passing: bool, timeout: float) -> float:
        """Seconds until the probe passed successThreshold times in a row
        (passing) or failed failureThreshold times (not passing). Polled every
        0.25 s: the outcome is checked, not the kubelet's schedule."""
        t0 = time.monotonic()
        in_a_row, last = 0, "none yet"
        while time.monotonic() - t0 < timeout:
            self.alive()
            ok, last = self.probe(p)
            in_a_row = in_a_row + 1 if ok == passing else 0
            if in_a_row >= p["successThreshold" if passing else "failureThreshold"]:
                return time.monotonic() - t0
            time.sleep(0.25)
        state = {"readiness": ("unready", "Ready"), "liveness": ("failing liveness", "live")}[p["kind"]][passing]
        raise SmokeFailure(f"{self.owner}: not {state} after {timeout:.0f} s: {p['kind']} probe {show(p)}; "
                           f"last answer: {last}")

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
            why = "killed at the end of the grace period" if code == 137 else "not a clean exit"
            raise SmokeFailure(f"{self.owner}: exit code {code} after SIGTERM ({why}); its last lines:\n"
                               + indent(self.logs(15)))
        return secs

    def run_to_completion(self) -> int:
        deadline = min(self.obj["spec"].get("activeDeadlineSeconds", 300), 300)
        try:
            return int(podman("wait", self.ctr, timeout=deadline).stdout.split()[-1])
        except subprocess.TimeoutExpired:
            raise SmokeFailure(f"{self.owner}: DeadlineExceeded: still running after {deadline} s") from None

    def down(self) -> None:
        if self.ctr:
            (WORKDIR / f"{self.name}.log").write_text(self.logs())
        if self.pod:
            podman("pod", "rm", "-f", "-t", "0", self.pod, check=False)


def show(p: dict) -> str:
    return f"GET :{p['port']}{p['path']}, timeout {p['timeoutSeconds']} s"
