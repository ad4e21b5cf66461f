"""The smoke's operations on the rendered pods: plan them, start them as a
kubelet would and read back what they got, stop them, and the traffic and
audits around them. scenario.py puts them in order."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from . import admission
from .kubelet import Pod, Stopped, indent, run_to_completion, terminate
from .neighbours import ROOT, Cluster, Downstream
from .objects import Objects, SmokeFailure, add_example_secrets, render, rewrite_addresses
from .pod import Container, containers, find, resolve_port
from .podman import HOST_FROM_CONTAINER, Runtime, effective, image_user

# The workloads, by what they are in the render.
MIGRATE_KIND = "Job"
SERVICES = ("Deployment/webhook-ingest", "Deployment/outbox-relay")
INGEST, RELAY = SERVICES


@dataclass
class Options:
    overlay: Path
    secrets: Path
    images: dict  # target/images/images.json
    kubectl: str
    key: str
    workdir: Path
    ready_timeout: float
    mutate: object = None  # a function of the rendered objects (the self-test's breaks)
    quiet: bool = False  # no account of the plan (the self-test's runs)


@dataclass
class Figures:
    cold_start: dict[str, float] = field(default_factory=dict)
    kubelet_ready: dict[str, float] = field(default_factory=dict)
    stops: dict[str, Stopped] = field(default_factory=dict)
    migrate_secs: float = 0.0


class Steps:
    def __init__(self, total: int) -> None:
        self.n, self.total, self.t0 = 0, total, time.monotonic()

    @contextmanager
    def step(self, title: str):
        self.n += 1
        t = time.monotonic()
        print(f"[{self.n}/{self.total}] {title}", flush=True)
        yield
        print(f"      done ({time.monotonic() - t:.1f} s; {time.monotonic() - self.t0:.0f} s since the start)", flush=True)


def say(text: str) -> None:
    print("\n".join(f"      {line}" for line in text.splitlines()), flush=True)


class Smoke:
    def __init__(self, opts: Options, cluster: Cluster, downstream: "Downstream") -> None:
        self.o = opts
        self.cluster = cluster
        self.downstream = downstream
        self.runtime = Runtime(opts.key, opts.workdir)
        self.bindir = ROOT / opts.images["bindir"]
        self.password = secrets.token_hex(16)
        self.figures = Figures()
        self.pods: list[Pod] = []

    # --- the render ---------------------------------------------------------------
    def plan(self) -> list[Container]:
        objs = Objects(render(self.o.kubectl, self.o.overlay))
        if self.o.mutate:
            say(f"broken on purpose: {self.o.mutate(objs)}")
        self.objs = objs
        ns = self.namespace = objs.namespace()
        notes = add_example_secrets(objs, self.o.secrets, ns, self.password)
        notes += [f"stand-in: {n}" for n in rewrite_addresses(
            objs, ns, {"postgres": (HOST_FROM_CONTAINER, self.cluster.port)},
            ("http", HOST_FROM_CONTAINER, self.downstream.port))]
        enforce, refused = admission.admit(objs, ns)
        for owner, problems in refused.items():
            if problems:
                raise SmokeFailure(f'{owner}: pods "{owner.split("/")[1]}-..." are forbidden: violates PodSecurity '
                                   f'"{enforce}:latest": ' + ", ".join(problems))
        notes.append(f"namespace {ns}: Pod Security \"{enforce}\" enforced; every pod template admitted")
        self.containers = containers(objs)
        notes += [self.describe(c) for c in self.containers]
        if not self.o.quiet:
            for note in notes:
                say(note)
        return self.containers

    def image_id(self, c: Container) -> str:
        """The rendered image, as podman names a local image, must be one
        `make images` built: its id, not its tag, is run (the tag could have
        been moved since by another build)."""
        ref = c.image
        first = ref.split("/", 1)[0]
        if "/" not in ref or ("." not in first and ":" not in first and first != "localhost"):
            ref = f"localhost/{ref}"
        if ":" not in ref.rsplit("/", 1)[-1] and "@" not in ref:
            ref += ":latest"
        for name, image in self.o.images["images"].items():
            if image["tag"] == ref:
                return image["id"]
        built = ", ".join(i["tag"] for i in self.o.images["images"].values())
        raise SmokeFailure(f"{c.owner} runs image {c.image} ({ref}), which make images did not build (it built {built})")

    def describe(self, c: Container) -> str:
        who = f"uid {c.run_as_user}" + (f":{c.run_as_group}" if c.run_as_group is not None else "")
        parts = [f"{c.owner}: {c.image} {' '.join((c.command or []) + (c.args or []))}".rstrip(),
                 who, "read-only root" if c.read_only_root else "writable root",
                 f"capabilities drop {c.cap_drop}" + (f" add {c.cap_add}" if c.cap_add else ""),
                 "no privilege escalation" if not c.allow_privilege_escalation else "privilege escalation allowed",
                 f"seccomp {c.seccomp}"]
        if c.memory_limit:
            parts.append(f"memory {c.memory_limit // 2**20} MiB")
        ours = sorted(k for k, s in c.env_sources.items() if s != "Service link")
        parts.append(f"{len(ours)} variables ({len({s for k, s in c.env_sources.items() if s != 'Service link'})} sources)"
                     f" + {len(c.env) - len(ours)} Service links")
        for p in (c.liveness, c.readiness):
            if p:
                parts.append(f"{p.kind} {p.describe()}")
        if c.kind == "Deployment":
            parts.append(f"grace {c.grace_seconds} s" + (f", {c.pre_stop.describe()}" if c.pre_stop else ""))
        return "; ".join(parts)

    # --- the database -------------------------------------------------------------
    def database(self) -> str:
        """The roles and databases the Secrets' URLs name, made afresh (the
        dev overlay's Postgres makes them from its own Secret)."""
        wanted: dict[str, tuple[str, str]] = {}
        for s in self.objs.of_kind("Secret"):
            for k, v in (self.objs.data("Secret", self.namespace, s["metadata"]["name"]) or {}).items():
                if v.startswith(("postgres://", "postgresql://")):
                    u = urlsplit(v)
                    if u.port == self.cluster.port:
                        wanted[u.path.lstrip("/")] = (u.username, u.password)
        for db, (user, password) in wanted.items():
            self.cluster.sql(f"DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)")
            self.cluster.sql(f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{user}') "
                             f"THEN CREATE ROLE \"{user}\" LOGIN CREATEROLE; END IF; END $$")
            self.cluster.sql(f"SET log_statement = 'none'; ALTER ROLE \"{user}\" PASSWORD '{password}'")
            self.cluster.sql(f"CREATE DATABASE \"{db}\" OWNER \"{user}\"")
            self.cluster.sql("REVOKE CREATE ON SCHEMA public FROM PUBLIC", db)
        if len(wanted) != 1:
            raise SmokeFailure(f"the Secrets name {len(wanted)} databases on the smoke's Postgres: {sorted(wanted)}")
        self.db = next(iter(wanted))
        if not self.o.quiet:
            say(f"database {self.db} (owner {wanted[self.db][0]}) on the smoke's Postgres, 127.0.0.1:{self.cluster.port}")
        return self.db

    def sql(self, query: str) -> str:
        return self.cluster.sql(query, self.db)

    # --- containers -----------------------------------------------------------------
    def start(self, c: Container) -> Pod:
        image = self.image_id(c)
        refusal = admission.kubelet_non_root(c, image_user(image))
        if refusal:
            raise SmokeFailure(f"{c.owner}: CreateContainerConfigError: {refusal}")
        extra = [p.port for p in (c.liveness, c.readiness) if p]
        if c.pre_stop and c.pre_stop.http_port:
            extra.append(c.pre_stop.http_port)
        t0 = time.monotonic()
        running = self.runtime.run(c, image, extra)
        pod = Pod(running, t0)
        self.pods.append(pod)
        return pod

    def verify(self, pod: Pod) -> None:
        """The settings as the process got them (/proc), against the manifest's."""
        c, got = pod.c, effective(pod.running)
        problems = []
        if c.run_as_user is not None and got["uid"] != c.run_as_user:
            problems.append(f"uid {got['uid']}, not {c.run_as_user}")
        if got["uid"] == 0:
            problems.append("runs as root")
        if c.run_as_group is not None and got["gid"] != c.run_as_group:
            problems.append(f"gid {got['gid']}, not {c.run_as_group}")
        if "ALL" in c.cap_drop and not c.cap_add and (got["cap_eff"] or got["cap_bnd"]):
            problems.append(f"capabilities left: effective {got['cap_eff']:#x}, bounding {got['cap_bnd']:#x}")
        if not c.allow_privilege_escalation and not got["no_new_privs"]:
            problems.append("no_new_privs not set")
        if c.read_only_root != got["root_read_only"]:
            problems.append(f"root filesystem {'read-only' if got['root_read_only'] else 'writable'}")
        if c.seccomp == "RuntimeDefault" and not got["seccomp"]:
            problems.append("no seccomp filter")
        if c.memory_limit and got["memory"] != c.memory_limit:
            problems.append(f"memory limit {got['memory']}, not {c.memory_limit}")
        if not got["pid1"]:
            problems.append("the binary is not PID 1")
        wrong = sorted(k for k, v in c.env.items() if got["environ"].get(k) != v)
        if wrong:
            problems.append(f"environment differs from the manifest's in {wrong}")
        extra = sorted(set(got["environ"]) - set(c.env))
        if problems:
            raise SmokeFailure(f"{c.owner}: the container did not get its settings: " + "; ".join(problems))
        say(f"{c.owner} as it runs (/proc): uid {got['uid']} gid {got['gid']}, capabilities none, "
            f"no_new_privs, seccomp filter, / {'read-only' if got['root_read_only'] else 'writable'}, PID 1"
            + (f", memory limit {got['memory'] // 2**20} MiB" if got["memory"] else "")
            + f", its {len(c.env)} variables exactly (and the runtime's {', '.join(extra)})")

    def migrate(self) -> None:
        jobs = [c for c in self.containers if c.kind == MIGRATE_KIND]
        if len(jobs) != 1:
            raise SmokeFailure(f"expected one Job in the render, found {[c.owner for c in jobs]}")
        job = jobs[0]
        if job.restart_policy != "Never":
            say(f"{job.owner}: restartPolicy {job.restart_policy}")
        refusal = admission.kubelet_non_root(job, image_user(self.image_id(job)))
        if refusal:
            raise SmokeFailure(f"{job.owner}: CreateContainerConfigError: {refusal}")
        running = self.runtime.run(job, self.image_id(job), [])
        try:
            code, secs = run_to_completion(running, job.active_deadline)
            logs = running.logs()
        finally:
            running.remove()
        if code != 0:
            raise SmokeFailure(f"{job.owner}: the container exited with {code} (the Job would retry, then fail):\n"
                               + indent(logs))
        self.figures.migrate_secs = secs
        versions = self.sql("SELECT string_agg(version::text, ',' ORDER BY version) FROM refinery_schema_history")
        say(f"{job.owner} completed in {secs:.1f} s (exit 0): migrations [{versions}] applied")

    def start_service(self, owner: str, measure: bool = True) -> Pod:
        # Planned afresh: a new pod has a new name (RELAY_ID is the pod's name).
        c = find(containers(self.objs), owner)
        pod = self.start(c)
        cold = pod.first_ready(self.o.ready_timeout) if measure and c.readiness else None
        # One deadline for both, from the start.
        ready = pod.wait_ready(max(0.1, self.o.ready_timeout - (time.monotonic() - pod.started)))
        self.verify(pod)
        if cold is not None:
            self.figures.cold_start[owner] = cold
            self.figures.kubelet_ready[owner] = ready
            say(f"{owner} ready {cold:.2f} s after podman run (first 200 from {c.readiness.path}); "
                f"Ready at the kubelet's probe at {ready:.1f} s")
        else:
            say(f"{owner} Ready at the kubelet's probe at {ready:.1f} s")
        return pod

    def service_port(self, owner: str) -> int:
        """The published port the Service of the same name routes to: its
        targetPort on the pod its selector picks."""
        name = owner.split("/", 1)[1]
        svc = self.objs.get("Service", self.namespace, name)
        if svc is None:
            raise SmokeFailure(f"no Service {name}")
        deployment = self.objs.get("Deployment", self.namespace, name)
        labels = deployment["spec"]["template"]["metadata"].get("labels") or {}
        selector = svc["spec"].get("selector") or {}
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            raise SmokeFailure(f"Service {name} selects {selector}, which the pods of {owner} do not carry: it routes nowhere")
        pod = self.pod(owner)
        target = svc["spec"]["ports"][0].get("targetPort", svc["spec"]["ports"][0]["port"])
        port = resolve_port(target, pod.c.ports, f"Service {name}")
        if port not in pod.running.host_ports:
            raise SmokeFailure(f"Service {name} targets port {port}, which the container does not declare")
        return pod.running.host_ports[port]

    def pod(self, owner: str) -> Pod:
        live = [p for p in self.pods if p.c.owner == owner and p.running.exited() is None]
        if not live:
            raise SmokeFailure(f"no running pod of {owner}")
        return live[-1]

    def steady(self) -> None:
        """Every running pod still Ready, never unready since it first was:
        under the traffic a kubelet would have kept it in its Service."""
        for pod in self.pods:
            pod.alive()
            if pod.readiness and [t for t in pod.readiness.transitions if not t[1]]:
                at, _, why = next(t for t in pod.readiness.transitions if not t[1])
                raise SmokeFailure(f"{pod.c.owner} went unready at {at:.1f} s ({why}): out of its Service meanwhile")

    def stop(self, owner: str, on_pre_stop=None, after_sigterm=None) -> Stopped:
        pod = self.pod(owner)
        pod.alive()
        stopped = terminate(pod, on_pre_stop, after_sigterm)
        (self.o.workdir / f"{pod.c.pod_name}.log").write_text(pod.running.logs())
        if stopped.exit_code != 0 or stopped.killed:
            raise SmokeFailure(f"{owner}: exit code {stopped.exit_code} after SIGTERM "
                               f"({'killed at the end of the grace period' if stopped.killed else 'not a clean exit'}); "
                               f"its last lines:\n" + indent(pod.running.logs(tail=15)))
        pod.running.remove()
        self.pods.remove(pod)
        self.figures.stops[owner] = stopped
        pre = f"after the {stopped.pre_stop_secs:.1f} s preStop, " if pod.c.pre_stop else ""
        say(f"{owner}: {pre}SIGTERM; exited 0 in {stopped.after_sigterm_secs:.1f} s "
            f"(grace period {stopped.grace_secs} s)")
        return stopped

    def cleanup(self) -> None:
        for pod in self.pods:
            pod.stop_probing()
            (self.o.workdir / f"{pod.c.pod_name}.log").write_text(pod.running.logs())
            pod.running.remove()
        self.pods = []

    # --- the provider and the downstream ---------------------------------------------
    def secret(self) -> str:
        return find(self.containers, INGEST).env["WEBHOOK_SECRETS"].split(",")[0].strip()

    def seed(self, first: int, last: int) -> None:
        self.sql(f"INSERT INTO orders (id, payment_id) SELECT n, 'pay_' || n FROM generate_series({first}, {last}) n")

    def send(self, payment: str, event_id: str) -> tuple[int, str]:
        done = subprocess.run([str(self.bindir / "simulator"), "send", payment, "--id", event_id,
                               "--target", f"http://127.0.0.1:{self.service_port(INGEST)}", "--secret", self.secret()],
                              capture_output=True, text=True, timeout=60)
        return done.returncode, (done.stdout + done.stderr).strip()

    def provider(self, events: int, first_order: int, run_id: str, extra: list[str]) -> dict:
        out = self.o.workdir / f"provider-{run_id}.json"
        cmd = [str(self.bindir / "simulator"), "provider", "--target", f"http://127.0.0.1:{self.service_port(INGEST)}",
               "--secret", self.secret(), "--events", str(events), "--orders", str(events),
               "--first-order", str(first_order), "--run-id", run_id, "--no-progress", "--json",
               "--timeout-ms", "5000", "--give-up-after-ms", "60000", *extra]
        with out.open("w") as f:
            done = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, timeout=180)
        if done.returncode != 0:
            raise SmokeFailure(f"the provider did not get a 2xx for every event: {done.stderr.strip()[-800:]}")
        return json.loads(out.read_text())

    def drain(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while True:
            left = int(self.sql("SELECT count(*) FROM outbox WHERE status = 'pending'"))
            if left == 0:
                return
            if time.monotonic() > deadline:
                raise SmokeFailure(f"{left} outbox rows still pending after {timeout:g} s")
            self.pod(RELAY).alive()
            time.sleep(0.2)

    def audit(self, label: str) -> str:
        lease = find(self.containers, RELAY).env.get("RELAY_LEASE_SECS", "60")
        out = self.o.workdir / f"audit-{label}.json"
        done = subprocess.run([str(self.bindir / "simulator"), "audit", "--database-url", self.cluster.url(self.db),
                               "--downstream", self.downstream.url, "--lease-secs", lease, "--json-file", str(out)],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise SmokeFailure(f"the audit failed:\n{indent(done.stdout + done.stderr)}")
        summary = json.loads(out.read_text())["exactly_once"]["summary"]
        say(f"audit: {summary}")
        return summary
