"""The smoke's steps, in order, on the played workloads: what ties the
manifests to the binaries."""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from .manifests import PLACEHOLDER, ROOT, Render, SmokeFailure
from .neighbours import Cluster, Downstream
from .pods import LABEL, Workload, indent, podman, remove_leftovers

INGEST, RELAY = "webhook-ingest", "outbox-relay"
# Enough events for duplicates, bursts and refunds to occur.
EVENTS = 200
# Rows whose downstream calls are under way when the relay gets SIGTERM,
# and how slowly the downstream answers them.
IN_FLIGHT_EVENTS = 40
SLOW_DOWNSTREAM_MS = 1500


@dataclass
class Options:
    overlay: Path
    secrets: Path
    images: dict  # target/images/images.json
    kubectl: str
    key: str
    workdir: Path
    ready_timeout: float


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
    def __init__(self, o: Options, cluster: Cluster, downstream: Downstream,
                 mutate: Callable[[Render], str] | None = None) -> None:
        self.o, self.cluster, self.downstream = o, cluster, downstream
        self.bindir = ROOT / o.images["bindir"]
        self.render = Render(o.kubectl, o.overlay, o.secrets, secrets.token_hex(16))
        if mutate:
            say(f"broken on purpose: {mutate(self.render)}")
        self.notes = [f"Secrets {', '.join(self.render.secrets)} from {o.secrets.name}, {PLACEHOLDER} filled with "
                      "this run's password"]
        self.notes += [f"stand-in: {n}" for n in self.render.stand_ins({"postgres": cluster.port}, downstream.port)]
        self.running: dict[str, Workload] = {}  # by name
        self.made: list[str] = []  # podman secrets
        self.figures: dict[str, float] = {}

    # --- around the pods ----------------------------------------------------------------
    def create_secrets(self) -> None:
        """Shim 1: podman 4.3's kube play stores a `kind: Secret` document
        as YAML and reads it back as JSON ("secret ... is not valid JSON"):
        each Secret is made with `podman secret create`, as the JSON of its
        base64 values, which is what secretKeyRef reads. Podman's secrets
        share one namespace: one of the same name the smoke did not make
        (its label) is left alone, and the smoke stops."""
        for name, values in self.render.secrets.items():
            found = podman("secret", "inspect", "--format", f'{{{{index .Spec.Labels "{LABEL}"}}}}', name, check=False)
            if found.returncode == 0 and found.stdout.strip() != self.o.key:
                raise SmokeFailure(f"podman has a secret {name} that the smoke did not make: remove or rename it")
            podman("secret", "rm", name, check=False)
            podman("secret", "create", "--label", f"{LABEL}={self.o.key}", name, "-",
                   stdin=json.dumps({k: base64.b64encode(v.encode()).decode() for k, v in values.items()}))
            self.made.append(name)

    def database(self) -> None:
        """The role and database the Secrets' URLs name, made afresh (the
        overlay's Postgres StatefulSet makes them from its own Secret)."""
        wanted = {}
        for values in self.render.secrets.values():
            for v in values.values():
                u = urlsplit(v)
                if u.scheme.startswith("postgres") and u.port == self.cluster.port:
                    wanted[u.path.lstrip("/")] = (u.username, u.password)
        if len(wanted) != 1:
            raise SmokeFailure(f"the Secrets name {len(wanted)} databases on the smoke's Postgres: {sorted(wanted)}")
        (self.db, (user, password)), = wanted.items()
        self.cluster.sql(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')
        self.cluster.sql(f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{user}') "
                         f'THEN CREATE ROLE "{user}" LOGIN CREATEROLE; END IF; END $$')
        self.cluster.sql(f"SET log_statement = 'none'; ALTER ROLE \"{user}\" PASSWORD '{password}'")
        self.cluster.sql(f'CREATE DATABASE "{self.db}" OWNER "{user}"')
        self.cluster.sql("REVOKE CREATE ON SCHEMA public FROM PUBLIC", self.db)
        say(f"database {self.db} (owner {user}) on the smoke's Postgres, 127.0.0.1:{self.cluster.port}")

    def sql(self, query: str) -> str:
        return self.cluster.sql(query, self.db)

    def cleanup(self) -> None:
        for w in list(self.running.values()):
            w.down()
        self.running.clear()
        for name in self.made:
            podman("secret", "rm", name, check=False)
        remove_leftovers(self.o.key)  # a pod whose play failed half way

    # --- the workloads ------------------------------------------------------------------
    def migrate(self) -> None:
        jobs = self.render.of_kind("Job")
        if len(jobs) != 1:
            raise SmokeFailure(f"expected one Job in the render, found {len(jobs)}")
        job = Workload(self.render, "Job", jobs[0]["metadata"]["name"], self.o.key, self.o.workdir)
        self.running[job.name] = job
        t0 = time.monotonic()
        job.play(self.o.images)
        code = job.run_to_completion()
        self.figures["migrate_secs"] = time.monotonic() - t0
        logs = job.logs()
        job.down()
        del self.running[job.name]
        if code != 0:
            raise SmokeFailure(f"{job.owner}: the container exited with {code} (the Job would retry, then fail):\n"
                               + indent(logs))
        versions = self.sql("SELECT string_agg(version::text, ',' ORDER BY version) FROM refinery_schema_history")
        say(f"{job.owner}: played as a Pod, exited 0 in {self.figures['migrate_secs']:.1f} s: migrations [{versions}]")

    def start(self, name: str, timeout: float) -> Workload:
        """Played; Ready by its readiness probe; live; its settings checked."""
        w = Workload(self.render, "Deployment", name, self.o.key, self.o.workdir)
        self.running[name] = w
        t0 = time.monotonic()
        w.play(self.o.images)
        if w.readiness:
            w.wait(w.readiness, True, timeout)
        ready = time.monotonic() - t0
        if w.liveness:
            w.wait(w.liveness, True, w.liveness.period * w.liveness.failure_threshold)
        self.figures[f"{name}_ready_secs"] = ready
        say(f"{w.owner}: pod {w.inspect()['Config']['Hostname']} Ready {ready:.1f} s after podman kube play "
            f"({w.readiness}); liveness {w.liveness} passes")
        say(w.verify())
        return w

    def stop(self, name: str) -> None:
        w = self.running[name]
        secs = w.stop()
        w.down()
        del self.running[name]
        self.figures[f"{name}_stop_secs"] = secs
        say(f"{w.owner}: " + (f"after the {w.pre_stop:g} s preStop sleep, " if w.pre_stop else "")
            + f"SIGTERM; exited 0 in {secs:.1f} s (grace period {w.grace} s)")

    def service_port(self, name: str) -> int:
        """The host port for the Service of that name: its targetPort on the
        pod its selector picks."""
        svc = self.render.get("Service", name)
        w = self.running[name]
        labels = w.obj["spec"]["template"]["metadata"].get("labels") or {}
        selector = svc["spec"].get("selector") or {}
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            raise SmokeFailure(f"Service {name} selects {selector}, which the pods of {w.owner} do not carry")
        target = svc["spec"]["ports"][0].get("targetPort", svc["spec"]["ports"][0]["port"])
        named = {p.get("name"): p["containerPort"] for p in w.c.get("ports") or []}
        port = named.get(target) if isinstance(target, str) else target
        if port not in w.ports:
            raise SmokeFailure(f"Service {name} targets port {target}, which the container does not declare")
        return w.ports[port]

    # --- the provider and the downstream ------------------------------------------------
    def secret(self) -> str:
        return self.render.env(self.running[INGEST].c, "")["WEBHOOK_SECRETS"].split(",")[0].strip()

    def seed(self, count: int) -> int:
        first = int(self.sql("SELECT coalesce(max(id), 0) + 1 FROM orders"))
        self.sql(f"INSERT INTO orders (id, payment_id) SELECT n, 'pay_' || n FROM generate_series({first}, {first + count - 1}) n")
        return first

    def send(self, payment: str, event_id: str) -> tuple[int, str]:
        done = subprocess.run([str(self.bindir / "simulator"), "send", payment, "--id", event_id, "--target",
                               f"http://127.0.0.1:{self.service_port(INGEST)}", "--secret", self.secret()],
                              capture_output=True, text=True, timeout=60)
        return done.returncode, (done.stdout + done.stderr).strip()

    def provider(self, events: int, first: int, run_id: str, extra: list[str]) -> dict:
        out = self.o.workdir / f"provider-{run_id}.json"
        cmd = [str(self.bindir / "simulator"), "provider", "--target", f"http://127.0.0.1:{self.service_port(INGEST)}",
               "--secret", self.secret(), "--events", str(events), "--orders", str(events), "--first-order", str(first),
               "--run-id", run_id, "--no-progress", "--json", "--timeout-ms", "5000", "--give-up-after-ms", "60000", *extra]
        with out.open("w") as f:
            done = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, timeout=180)
        if done.returncode != 0:
            raise SmokeFailure(f"the provider did not get a 2xx for every event: {done.stderr.strip()[-800:]}")
        return json.loads(out.read_text())

    def drain(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while (left := int(self.sql("SELECT count(*) FROM outbox WHERE status = 'pending'"))) > 0:
            if time.monotonic() > deadline:
                raise SmokeFailure(f"{left} outbox rows still pending after {timeout:g} s")
            self.running[RELAY].alive()
            time.sleep(0.2)

    def audit(self, label: str) -> None:
        lease = self.render.env(self.running[RELAY].c, "").get("RELAY_LEASE_SECS", "60")
        out = self.o.workdir / f"audit-{label}.json"
        done = subprocess.run([str(self.bindir / "simulator"), "audit", "--database-url", self.cluster.url(self.db),
                               "--downstream", self.downstream.url, "--lease-secs", lease, "--json-file", str(out)],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise SmokeFailure(f"the audit failed:\n{indent(done.stdout + done.stderr)}")
        say(f"audit: {json.loads(out.read_text())['exactly_once']['summary']}")


def full(s: Smoke, steps: Steps) -> None:
    shown = s.o.overlay.relative_to(ROOT) if s.o.overlay.is_relative_to(ROOT) else s.o.overlay
    with steps.step(f"render {shown} (kubectl kustomize); its Secrets and stand-ins"):
        s.create_secrets()
        for note in s.notes:
            say(note)
        s.database()
    with steps.step("the migration Job, to completion"):
        s.migrate()
    with steps.step("webhook-ingest and outbox-relay: podman kube play, Ready by their probes, settings from /proc"):
        for name in (INGEST, RELAY):
            s.start(name, s.o.ready_timeout)
    with steps.step(f"signed webhooks through the Service's port: one by hand and its replay, then {EVENTS} from the provider"):
        first = s.seed(EVENTS + 1)
        code, out = s.send(f"pay_{first + EVENTS}", "evt_smoke_by_hand")
        again, out2 = s.send(f"pay_{first + EVENTS}", "evt_smoke_by_hand")
        if code != 0 or again != 0 or "Idempotent-Replayed: true" not in out2:
            raise SmokeFailure(f"a webhook and its replay: {out!r} then {out2!r}")
        say(f"by hand: {out.splitlines()[0]}; again: {out2.splitlines()[0]}")
        p = s.provider(EVENTS, first, "smoke", ["--rate", "100", "--duplicate-rate", "0.2", "--burst-rate", "0.05",
                                                "--refund-rate", "0.05", "--unmatched-rate", "0.02"])
        say(f"provider: {p['events']} events, {p['deliveries']} deliveries ({p['duplicate_deliveries']} duplicates, "
            f"{p['burst_deliveries']} in bursts), all acknowledged")
        s.drain()
        s.audit("traffic")
    with steps.step("the database stopped: both unready (readiness), both live (liveness); started: Ready again"):
        database_down(s)
    with steps.step(f"outbox-relay stopped with {SLOW_DOWNSTREAM_MS} ms downstream calls under way; played again, it finishes the work"):
        relay_in_flight(s)
    with steps.step("webhook-ingest and outbox-relay stopped as the kubelet stops them"):
        for name in (INGEST, RELAY):
            s.stop(name)


def database_down(s: Smoke) -> None:
    order = s.seed(1)
    s.cluster.stop()
    say("Postgres stopped (pg_ctl stop -m fast)")
    for w in s.running.values():
        r, live = w.readiness, w.liveness
        secs = w.wait(r, False, r.period * (r.failure_threshold + 1) + r.timeout + 10)
        w.wait(live, True, live.period * live.failure_threshold)
        say(f"{w.owner} unready {secs:.1f} s after the stop ({w.probe(r)[1]}); liveness passes")
    code, out = s.send(f"pay_{order}", "evt_smoke_db_down")
    if code == 0:
        raise SmokeFailure(f"a webhook was accepted while the database was down: {out}")
    say(f"a webhook meanwhile: {out.splitlines()[0]} (the provider retries it)")
    s.cluster.start()
    say("Postgres started")
    for w in s.running.values():
        secs = w.wait(w.readiness, True, s.o.ready_timeout)
        say(f"{w.owner} Ready again {secs:.1f} s after the start")
    code, out = s.send(f"pay_{order}", "evt_smoke_db_down")
    if code != 0:
        raise SmokeFailure(f"the webhook refused during the outage, sent again: {out}")
    say(f"the same webhook again: {out.splitlines()[0]}")
    s.drain()


def relay_in_flight(s: Smoke) -> None:
    """The grace period against the relay's drain: calls under way at
    SIGTERM finish and are recorded; rows not started are released."""
    first = s.seed(IN_FLIGHT_EVENTS)
    before = s.downstream.stats()["requests"]
    s.downstream.faults({"latency_ms": str(SLOW_DOWNSTREAM_MS)})
    s.provider(IN_FLIGHT_EVENTS, first, "smoke_relay", ["--concurrency", "8"])
    deadline = time.monotonic() + 30
    while s.downstream.stats()["requests"] == before:
        if time.monotonic() > deadline:
            raise SmokeFailure("the relay made no downstream call within 30 s")
        time.sleep(0.05)
    s.stop(RELAY)
    stats = s.downstream.stats()
    s.downstream.faults({})
    leased = int(s.sql("SELECT count(*) FROM outbox WHERE status = 'pending' AND lease_owner IS NOT NULL"))
    if leased:
        raise SmokeFailure(f"{leased} rows still leased by the stopped relay: their calls wait for the lease to expire")
    called = {k for k, v in (stats.get("keys") or {}).items() if v.get("effects")}
    rows = dict(line.split("|") for line in s.sql("SELECT idempotency_key, status FROM outbox").splitlines())
    unrecorded = sorted(k for k in called if rows.get(k) == "pending")
    if unrecorded:
        raise SmokeFailure(f"calls made but not recorded as done by the stopped relay: {unrecorded[:5]}")
    pending = int(s.sql("SELECT count(*) FROM outbox WHERE status = 'pending'"))
    say(f"{stats['requests'] - before} calls were under way at SIGTERM: each finished and recorded; "
        f"{pending} rows not started were released, none leased")
    s.start(RELAY, s.o.ready_timeout)
    s.drain()
    s.audit("relay-stop")
