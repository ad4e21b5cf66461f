"""The render, and one workload of it (a Deployment, one replica; or the Job) under
`podman kube play`, with the shim: what podman 4.3 cannot do, done here ("Shim N").
1. A played `kind: Secret` is read back as JSON ("not valid JSON"): the overlay's
   example, REPLACE_ME filled, made by `podman secret create`.
2. No cluster DNS, no StatefulSet: URLs to the Service `postgres` lead to the smoke's
   Postgres, the `.invalid` APIs to the simulated downstream, on the host's loopback.
3. No Job: its pod template is played as a Pod and waited for.
4. Liveness becomes curl inside the container (distroless has none), readiness is
   ignored: both taken out, and made from the host as a kubelet makes them.
5. A containerPort is published at its own number and a pod on slirp4netns is out of
   the host's reach: each is published on 127.0.0.1 at a free port (the pod's IP).
6. runAsNonRoot is ignored: the kubelet's check is made here.
7. No preStop hook, and `podman stop` waits 10 s: the sleep, then `podman stop -t`.
8. A restart hides the exit code: restartPolicy Never; the first exit fails the smoke.
Not reproduced: NetworkPolicy, kube-proxy (followed by hand), Pod Security, scheduling."""

import base64
import copy
import http.client
import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from ports import free_port

ROOT = Path(__file__).resolve().parents[2]
WORKDIR = ROOT / "target/deploy-smoke"
# The label of the smoke's pods, with deploy-smoke.sh's key of the checkout.
LABEL, KEY = "webhooks.deploy-smoke", os.environ["DEPLOY_SMOKE_KEY"]
HOST_FROM_POD = "10.0.2.2"  # the host's loopback from a pod on slirp4netns (allow_host_loopback)
PROBE_DEFAULTS = {"path": "/", "timeoutSeconds": 1, "periodSeconds": 10,
                  "failureThreshold": 3, "successThreshold": 1}


class SmokeFailure(Exception):
    """The smoke failed: the message says what a cluster would have shown."""


def run(*cmd: str, check: bool = True, timeout: float = 180, stdin: str | None = None) -> str:
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        why = (done.stderr or done.stdout).strip()[-800:]
        raise SmokeFailure(f"{Path(cmd[0]).name} {' '.join(cmd[1:3])}: {why}")
    return done.stdout.strip()


def podman(*args: str, **kwargs) -> str:
    return run("podman", *args, **kwargs)


def remove_pods() -> None:
    """This checkout's pods, by their label: an interrupted run's, or a half-played one."""
    for pod in podman("pod", "ps", "-q", "--filter", f"label={LABEL}={KEY}").split():
        podman("pod", "rm", "-f", "-t", "0", pod, check=False)


def until(what: str, done, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SmokeFailure(f"{what}: not within {timeout:g} s")
        time.sleep(0.2)


class Render:
    """`kubectl kustomize` of the overlay, and its example Secrets filled (shim 1)."""

    def __init__(self, overlay: Path, password: str) -> None:
        rendered = run(os.environ.get("DEPLOY_CHECK_KUBECTL", "kubectl"), "kustomize", str(overlay))
        self.docs = [d for d in yaml.safe_load_all(rendered) if d]
        examples = yaml.safe_load_all((overlay / "secrets.example.yaml").read_text())
        self.secrets = {d["metadata"]["name"]: {k: v.replace("REPLACE_ME", password)
                                                for k, v in d["stringData"].items()}
                        for d in examples if d and d["kind"] == "Secret"}

    def get(self, kind: str, name: str | None = None) -> dict:
        found = [d for d in self.docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
        if len(found) != 1:
            raise SmokeFailure(f"the render has {len(found)} {kind}/{name or '*'}, not one")
        return found[0]

    def stand_ins(self, postgres: int, downstream: int) -> None:
        """Shim 2, in every ConfigMap and Secret value."""
        ns = self.get("Namespace")["metadata"]["name"]
        hosts = {"postgres" + s for s in ("", f".{ns}", f".{ns}.svc", f".{ns}.svc.cluster.local")}
        ports = [p["port"] for p in self.get("Service", "postgres")["spec"]["ports"]]

        def rewrite(value: str) -> str:
            u = urlsplit(value)
            host, user = u.hostname or "", "".join(u.netloc.rpartition("@")[:2])
            if host in hosts:
                if (u.port or ports[0]) not in ports:
                    raise SmokeFailure(f"a URL names {host}:{u.port}; Service postgres serves {ports}")
                return u._replace(netloc=f"{user}{HOST_FROM_POD}:{postgres}").geturl()
            if host.endswith(".invalid"):
                netloc = f"{user}{HOST_FROM_POD}:{downstream}"
                return u._replace(scheme="http", netloc=netloc).geturl()
            return value

        for cm in (d for d in self.docs if d["kind"] == "ConfigMap"):
            cm["data"] = {k: rewrite(str(v)) for k, v in (cm.get("data") or {}).items()}
        for values in self.secrets.values():
            values.update({k: rewrite(v) for k, v in values.items()})

    def create_secrets(self) -> None:
        """Shim 1: as secretKeyRef reads them, the JSON of the base64 values."""
        for name, values in self.secrets.items():
            podman("secret", "rm", name, check=False)
            data = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
            podman("secret", "create", name, "-", stdin=json.dumps(data))


class Workload:
    def __init__(self, render: Render, kind: str, name: str) -> None:
        self.render, self.kind, self.name, self.owner = render, kind, name, f"{kind}/{name}"
        self.obj = render.get(kind, name)
        spec = self.obj["spec"]["template"]["spec"]
        self.c = spec["containers"][0]
        hook = (self.c.get("lifecycle") or {}).get("preStop") or {}
        if len(spec["containers"]) > 1 or spec.get("initContainers") or set(hook) - {"sleep"}:
            raise SmokeFailure(f"{self.owner}: more than one container or a preStop other than "
                               "sleep: teach pods.py")
        self.named_ports = {p.get("name"): p["containerPort"] for p in self.c.get("ports") or []}
        self.readiness, self.liveness = self.probe_of("readiness"), self.probe_of("liveness")
        self.sc = {**(spec.get("securityContext") or {}), **(self.c.get("securityContext") or {})}
        self.grace = int(spec.get("terminationGracePeriodSeconds", 30))
        self.pre_stop = float(hook["sleep"]["seconds"]) if hook else 0.0
        self.ports: dict[int, int] = {}  # container port -> 127.0.0.1 port (shim 5)
        self.pod = self.ctr = ""

    def probe_of(self, kind: str) -> dict | None:
        if not (spec := self.c.get(f"{kind}Probe")):
            return None
        port = spec["httpGet"]["port"]  # a name make deploy-check holds to the binary's port
        return {**PROBE_DEFAULTS, **spec, **spec["httpGet"], "kind": kind,
                "port": self.named_ports.get(port, port)}

    def playable(self) -> list[dict]:
        """What `podman kube play` gets: the ConfigMaps and this workload, shimmed."""
        obj = copy.deepcopy(self.obj)
        if self.kind == "Job":  # Shim 3
            t = obj["spec"]["template"]
            obj = {"apiVersion": "v1", "kind": "Pod", "spec": t["spec"],
                   "metadata": {**t.get("metadata", {}), "name": self.name}}
        template = obj if self.kind == "Job" else obj["spec"]["template"]
        template.setdefault("metadata", {}).setdefault("labels", {})[LABEL] = KEY
        template["spec"]["restartPolicy"] = "Never"  # Shim 8
        c = template["spec"]["containers"][0]
        for k in ("livenessProbe", "readinessProbe", "startupProbe"):  # Shim 4
            c.pop(k, None)
        # Shim 5: each containerPort, and each port a probe names (a kubelet probes any port).
        declared = {p["containerPort"]: p for p in c.setdefault("ports", [])}
        wanted = set(declared) | {p["port"] for p in (self.readiness, self.liveness) if p}
        self.ports = {port: free_port() for port in sorted(wanted)}
        for port, host in self.ports.items():
            if port not in declared:
                c["ports"].append(declared.setdefault(port, {"containerPort": port}))
            declared[port].update(hostPort=host, hostIP="127.0.0.1")
        return [d for d in self.render.docs if d["kind"] == "ConfigMap"] + [obj]

    def play(self) -> None:
        # Shim 6: a kubelet refuses runAsUser 0 under runAsNonRoot (without a runAsUser it
        # checks the image's USER, which make deploy-check ties to the manifests).
        if self.sc.get("runAsNonRoot") and self.sc.get("runAsUser") == 0:
            raise SmokeFailure(f"{self.owner}: CreateContainerConfigError: container's runAsUser "
                               "breaks non-root policy (runAsNonRoot with runAsUser=0)")
        played = WORKDIR / f"{self.name}.yaml"
        played.write_text(yaml.safe_dump_all(self.playable()))
        # A network namespace per pod, as in a cluster. No --replace: a pod of
        # the same name that is not the smoke's is not removed.
        words = podman("kube", "play", "--network", "slirp4netns:allow_host_loopback=true",
                       str(played)).split()  # "Pod:\n<id>\nContainer:\n<id>"
        self.pod, self.ctr = words[words.index("Pod:") + 1], words[words.index("Container:") + 1]
        built = [f.read_text().strip() for f in (ROOT / "target/images").glob("*.iid")]
        if "sha256:" + self.inspect()["Image"] not in built:
            raise SmokeFailure(f"{self.owner} runs {self.c['image']}, which make images did not build")

    def inspect(self) -> dict:
        return json.loads(podman("container", "inspect", self.ctr))[0]

    def logs(self, tail: int = 0) -> str:
        done = subprocess.run(["podman", "logs", self.ctr], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=60)
        return "\n".join(done.stdout.splitlines()[-tail:])

    def alive(self) -> None:
        state = self.inspect()["State"]
        if state["Status"] != "running":
            raise SmokeFailure(f"{self.owner}: the container exited with {state['ExitCode']} "
                               "(CrashLoopBackOff); its last lines:\n" + self.logs(15))

    def probe(self, p: dict) -> str:
        """A kubelet's probe: '' if it passes (a 2xx or 3xx within the timeout), else why not."""
        url = f"http://127.0.0.1:{self.ports[p['port']]}{p['path']}"
        try:
            urllib.request.urlopen(url, timeout=p["timeoutSeconds"]).close()
            return ""
        except (OSError, http.client.HTTPException) as e:  # HTTPError (4xx, 5xx) is an OSError
            return f"{type(e).__name__}: {e}"

    def wait(self, p: dict, passing: bool, timeout: float) -> None:
        """Until it passed successThreshold times in a row, or failed failureThreshold times."""
        t0, in_a_row, last = time.monotonic(), 0, "none yet"
        while time.monotonic() - t0 < timeout:
            self.alive()
            last = self.probe(p)
            in_a_row = in_a_row + 1 if (last == "") == passing else 0
            if in_a_row >= p["successThreshold" if passing else "failureThreshold"]:
                return
            time.sleep(0.25)
        state = {"readiness": "Ready", "liveness": "live"}[p["kind"]]
        raise SmokeFailure(f"{self.owner}: {'not' if passing else 'still'} {state} after {timeout:.0f} s: "
                           f"{p['kind']} probe GET :{p['port']}{p['path']}; last: {last or 'passed'}")

    def stop(self) -> None:
        """Shim 7: the preStop sleep, SIGTERM, SIGKILL once the grace period is spent.
        The container alone: `podman pod stop` would take the pod's network away
        under calls in flight (a kubelet removes the sandbox last)."""
        self.alive()
        time.sleep(min(self.pre_stop, self.grace))
        left = max(2, round(self.grace - self.pre_stop))
        podman("stop", "-t", str(left), self.ctr, timeout=left + 60)
        code = self.inspect()["State"]["ExitCode"]
        if code != 0:
            why = "killed at the end of the grace period" if code == 137 else "not a clean exit"
            raise SmokeFailure(f"{self.owner}: exit code {code} after SIGTERM ({why}); "
                               "its last lines:\n" + self.logs(15))

    def down(self) -> None:
        if self.ctr:
            (WORKDIR / f"{self.name}.log").write_text(self.logs())
        if self.pod:
            podman("pod", "rm", "-f", "-t", "0", self.pod, check=False)
