"""`make deploy-smoke`: the rendered dev overlay run by `podman kube play`, with
the checks that tie the manifests to the binaries, and a named shim for what
podman 4.3 cannot do (pods.py). Run it through scripts/deploy-smoke.sh. The
steps are `full`'s; then three renders broken on purpose, which it must
refuse, each for its reason."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from urllib.parse import urlsplit

from .pods import ROOT, WORKDIR, Render, SmokeFailure, Workload, indent, remove_pods, show

INGEST, RELAY = "webhook-ingest", "outbox-relay"
# Built with the binaries in the images (scripts/images.sh).
SIMULATOR = ROOT / "target" / os.environ.get("IMAGES_PROFILE", "release") / "simulator"
# Enough events for duplicates, bursts and refunds to occur.
EVENTS = 200
# Rows whose downstream calls are under way when the relay gets SIGTERM,
# and how slowly the downstream answers them.
IN_FLIGHT_EVENTS = 40
SLOW_DOWNSTREAM_MS = 1500


def say(text: str) -> None:
    print("\n".join(f"      {line}" for line in text.splitlines()), flush=True)


def run(*cmd: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


class Postgres:
    """The smoke's own throwaway Postgres, which it stops and starts: scripts/pg-cluster.sh
    with a folder and a port of its own (deploy-smoke.sh)."""

    def __init__(self) -> None:
        self.url = self.pg("start").strip().splitlines()[-1]
        self.port = urlsplit(self.url).port

    def pg(self, verb: str) -> str:
        done = run(str(ROOT / "scripts/pg-cluster.sh"), verb)
        if done.returncode != 0:
            raise SmokeFailure(f"scripts/pg-cluster.sh {verb}: {done.stderr.strip()}")
        return done.stdout

    def sql(self, sql: str, database: str = "postgres") -> str:
        url = self.url.rsplit("/", 1)[0] + "/" + database
        done = run("psql", url, "-X", "-qAt", "-v", "ON_ERROR_STOP=1", "-c", sql, timeout=60)
        if done.returncode != 0:
            raise SmokeFailure(f"psql: {done.stderr.strip()}")
        return done.stdout.strip()


class Downstream:
    """The simulated fulfilment and email APIs (crates/simulator), on the host's loopback."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([str(SIMULATOR), "downstream", "--listen", "127.0.0.1:0"],
                                     stdout=subprocess.PIPE, stderr=(WORKDIR / "downstream.log").open("w"), text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise SmokeFailure(f"the simulated downstream did not start (see {WORKDIR / 'downstream.log'})")
        self.url = f"http://{json.loads(line)['listening']}"
        self.port = urlsplit(self.url).port

    def faults(self, faults: dict) -> None:
        request = urllib.request.Request(f"{self.url}/control/faults", json.dumps(faults).encode(),
                                         {"content-type": "application/json"})
        urllib.request.urlopen(request, timeout=10).read()

    def stats(self) -> dict:
        return json.loads(urllib.request.urlopen(f"{self.url}/stats", timeout=10).read())


class Smoke:
    def __init__(self, pg: Postgres, downstream: Downstream, ready_timeout: float, broken: str = "") -> None:
        self.pg, self.downstream, self.ready_timeout = pg, downstream, ready_timeout
        kubectl = os.environ.get("DEPLOY_CHECK_KUBECTL", "kubectl")
        self.render = Render(kubectl, ROOT / "deploy/overlays/dev", secrets.token_hex(16))
        if broken:
            what, mutate, _ = BREAKS[broken]
            mutate(self.render.get("Deployment", INGEST)["spec"]["template"]["spec"]["containers"][0])
            say(f"broken on purpose: webhook-ingest's {what}")
        self.notes = [f"Secrets {', '.join(self.render.secrets)} from secrets.example.yaml, REPLACE_ME filled "
                      "with this run's password"]
        self.notes += [f"stand-in: {n}" for n in self.render.stand_ins(pg.port, downstream.port)]
        self.running: dict[str, Workload] = {}

    def sql(self, query: str) -> str:
        return self.pg.sql(query, self.db)

    def database(self) -> None:
        """The Secrets, and the role and database their URLs name, made afresh
        (in the overlay, its Postgres StatefulSet makes them)."""
        self.render.create_secrets()
        urls = {urlsplit(v) for values in self.render.secrets.values() for v in values.values()}
        wanted = {(u.path.lstrip("/"), u.username, u.password) for u in urls if u.port == self.pg.port}
        if len(wanted) != 1:
            raise SmokeFailure(f"the Secrets name {len(wanted)} databases on the smoke's Postgres, not one")
        [(self.db, user, password)] = wanted
        self.pg.sql(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')
        self.pg.sql(f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{user}') "
                    f'THEN CREATE ROLE "{user}" LOGIN CREATEROLE; END IF; END $$')
        self.pg.sql(f"SET log_statement = 'none'; ALTER ROLE \"{user}\" PASSWORD '{password}'")
        self.pg.sql(f'CREATE DATABASE "{self.db}" OWNER "{user}"')
        self.pg.sql("REVOKE CREATE ON SCHEMA public FROM PUBLIC", self.db)
        say(f"database {self.db} (owner {user}) on the smoke's Postgres, 127.0.0.1:{self.pg.port}")

    def migrate(self) -> None:
        job = self.running["job"] = Workload(self.render, "Job", self.render.get("Job")["metadata"]["name"])
        t0 = time.monotonic()
        job.play()
        code, logs = job.run_to_completion(), job.logs()
        self.running.pop("job").down()
        if code != 0:
            raise SmokeFailure(f"{job.owner}: the container exited with {code} (the Job would retry, then fail):\n"
                               + indent(logs))
        versions = self.sql("SELECT string_agg(version::text, ',' ORDER BY version) FROM refinery_schema_history")
        say(f"{job.owner}: played as a Pod, exited 0 in {time.monotonic() - t0:.1f} s: migrations [{versions}]")

    def start(self, name: str) -> None:
        """Played; Ready by its readiness probe; live by its liveness probe."""
        w = self.running[name] = Workload(self.render, "Deployment", name)
        if not (w.readiness and w.liveness):
            raise SmokeFailure(f"{w.owner}: a readiness and a liveness probe are checked here; it lacks one")
        t0 = time.monotonic()
        w.play()
        w.wait(w.readiness, True, self.ready_timeout)
        ready = time.monotonic() - t0
        w.wait(w.liveness, True, w.liveness["periodSeconds"] * w.liveness["failureThreshold"])
        say(f"{w.owner}: pod {w.inspect()['Config']['Hostname']} Ready {ready:.1f} s after podman kube play "
            f"({show(w.readiness)}); liveness {show(w.liveness)} passes")

    def stop(self, name: str) -> None:
        w = self.running.pop(name)
        secs = w.stop()
        w.down()
        say(f"{w.owner}: " + (f"after the {w.pre_stop:g} s preStop sleep, " if w.pre_stop else "")
            + f"SIGTERM; exited 0 in {secs:.1f} s (grace period {w.grace} s)")

    def __enter__(self) -> Smoke:
        return self

    def __exit__(self, *_) -> None:
        for w in self.running.values():
            w.down()
        self.running.clear()
        for name in self.render.secrets:
            run("podman", "secret", "rm", name)
        remove_pods()

    def ingest_url(self) -> str:
        """kube-proxy's part: the Service's targetPort on the pod its selector picks."""
        svc, w = self.render.get("Service", INGEST), self.running[INGEST]
        labels = w.obj["spec"]["template"]["metadata"].get("labels") or {}
        selector = svc["spec"].get("selector") or {}
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            raise SmokeFailure(f"Service {INGEST} selects {selector}, which the pods of {w.owner} do not carry")
        target = svc["spec"]["ports"][0].get("targetPort", svc["spec"]["ports"][0]["port"])
        port = w.named_ports.get(target) if isinstance(target, str) else target
        if port not in w.ports:
            raise SmokeFailure(f"Service {INGEST} targets port {target}, which the container does not declare")
        return f"http://127.0.0.1:{w.ports[port]}"

    def seed(self, count: int) -> int:
        first = int(self.sql("SELECT coalesce(max(id), 0) + 1 FROM orders"))
        self.sql(f"INSERT INTO orders (id, payment_id) SELECT n, 'pay_' || n "
                 f"FROM generate_series({first}, {first + count - 1}) n")
        return first

    def provider(self, events: int, first: int, run_id: str, *extra: str) -> dict:
        """Signed webhooks through the Service, with the secret the ingest's process has."""
        secret = self.running[INGEST].environ()["WEBHOOK_SECRETS"].split(",")[0].strip()
        done = run(str(SIMULATOR), "provider", "--target", self.ingest_url(), "--secret", secret, "--events",
                   str(events), "--orders", str(events), "--first-order", str(first), "--run-id", run_id,
                   "--no-progress", "--json", "--timeout-ms", "5000", "--give-up-after-ms", "60000", *extra)
        if done.returncode != 0:
            raise SmokeFailure(f"the provider did not get a 2xx for every event: {done.stderr.strip()[-800:]}")
        (WORKDIR / f"provider-{run_id}.json").write_text(done.stdout)
        return json.loads(done.stdout)

    def drain(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while (left := int(self.sql("SELECT count(*) FROM outbox WHERE status = 'pending'"))) > 0:
            if time.monotonic() > deadline:
                raise SmokeFailure(f"{left} outbox rows still pending after {timeout:g} s")
            self.running[RELAY].alive()
            time.sleep(0.2)


class Steps:
    def __init__(self, total: int) -> None:
        self.n, self.total, self.t0 = 0, total, time.monotonic()

    @contextmanager
    def __call__(self, title: str):
        self.n, t = self.n + 1, time.monotonic()
        print(f"[{self.n}/{self.total}] {title}", flush=True)
        yield
        say(f"done ({time.monotonic() - t:.1f} s; {time.monotonic() - self.t0:.0f} s since the start)")


def full(s: Smoke, step: Steps) -> None:
    with step("render deploy/overlays/dev (kubectl kustomize); its Secrets and stand-ins"):
        say("\n".join(s.notes))
        s.database()
    with step("the migration Job, to completion"):
        s.migrate()
    with step("webhook-ingest and outbox-relay: podman kube play, Ready and live by their probes"):
        for name in (INGEST, RELAY):
            s.start(name)
    with step(f"{EVENTS} signed webhooks through the Service's port, with duplicates, bursts and refunds"):
        webhooks(s)
    with step("the database stopped: both unready (readiness), both live (liveness); started: Ready again"):
        database_down(s)
    with step(f"outbox-relay stopped with {SLOW_DOWNSTREAM_MS} ms downstream calls under way; played again, it "
              "finishes the work"):
        relay_in_flight(s)
    with step("webhook-ingest and outbox-relay stopped as the kubelet stops them"):
        for name in (INGEST, RELAY):
            s.stop(name)


def webhooks(s: Smoke) -> None:
    p = s.provider(EVENTS, s.seed(EVENTS), "smoke", "--rate", "100", "--duplicate-rate", "0.2", "--burst-rate", "0.05",
                   "--refund-rate", "0.05", "--unmatched-rate", "0.02")
    say(f"provider: {p['events']} events, {p['deliveries']} deliveries ({p['duplicate_deliveries']} duplicates, "
        f"{p['burst_deliveries']} in bursts), all acknowledged")
    s.drain()


def database_down(s: Smoke) -> None:
    s.pg.pg("stop")
    say("Postgres stopped (pg_ctl stop -m fast)")
    for w in s.running.values():
        r, live = w.readiness, w.liveness
        secs = w.wait(r, False, r["periodSeconds"] * (r["failureThreshold"] + 1) + r["timeoutSeconds"] + 10)
        w.wait(live, True, live["periodSeconds"] * live["failureThreshold"])
        say(f"{w.owner} unready {secs:.1f} s after the stop ({w.probe(r)[1]}); liveness passes")
    s.pg.pg("start")
    for w in s.running.values():
        say(f"{w.owner} Ready again {w.wait(w.readiness, True, s.ready_timeout):.1f} s after Postgres started")


def relay_in_flight(s: Smoke) -> None:
    """The grace period against the relay's drain: calls under way at
    SIGTERM finish and are recorded; rows not started are released."""
    first = s.seed(IN_FLIGHT_EVENTS)
    before = s.downstream.stats()["requests"]
    s.downstream.faults({"latency_ms": str(SLOW_DOWNSTREAM_MS)})
    s.provider(IN_FLIGHT_EVENTS, first, "smoke_relay", "--concurrency", "8")
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
    pending = sum(status == "pending" for status in rows.values())
    say(f"{stats['requests'] - before} calls were under way at SIGTERM: each finished and recorded; "
        f"{pending} rows not started were released, none leased")
    s.start(RELAY)
    s.drain()


# The smoke's own test: renders broken on purpose, each of which it must refuse
# for the right reason (what a cluster would show). Name: (what is broken, how,
# on webhook-ingest's container; the reason).
BREAKS = {
    "readiness-port": ("readinessProbe.httpGet.port: 9999 (nothing listens there)",
                       lambda c: c["readinessProbe"]["httpGet"].update(port=9999), "not Ready"),
    "root-user": ("securityContext.runAsUser: 0",
                  lambda c: c.setdefault("securityContext", {}).update(runAsUser=0), "runAsUser=0"),
    "missing-variable": ("env without WEBHOOK_SECRETS",
                         lambda c: c.update(env=[e for e in c["env"] if e["name"] != "WEBHOOK_SECRETS"]),
                         "exited with 2"),
}


def refused(s: Smoke, name: str) -> None:
    expect = BREAKS[name][2]
    try:
        s.database()
        s.migrate()
        for workload in (INGEST, RELAY):
            s.start(workload)
    except SmokeFailure as e:
        if expect in str(e):
            say(f"the smoke FAILS, as it must: {e}")
            return
        problem = f"failed, but not for the expected reason ({expect!r}): {e}"
    else:
        problem = "the smoke passed a broken render"
    raise SmokeFailure(f"the smoke's self-test, {name}: {problem}")


def main() -> int:
    # SIGTERM (a CI job's timeout) unwinds like Ctrl-C: every pod is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Logs and the played YAML of the last run only.
    shutil.rmtree(WORKDIR, ignore_errors=True)
    WORKDIR.mkdir(parents=True)
    if left := remove_pods():
        print(f"deploy-smoke: removed {left} pod(s) an interrupted run left")
    ready_timeout = float(os.environ.get("DEPLOY_SMOKE_READY_SECS", 60))
    step = Steps(7 + len(BREAKS))
    pg, downstream = Postgres(), Downstream()
    try:
        with Smoke(pg, downstream, ready_timeout) as smoke:
            full(smoke, step)
        for name in BREAKS:
            # A broken pod need not take the whole ready timeout to be refused.
            with step(f"self-test: a broken render ({name}) must fail the smoke"), \
                    Smoke(pg, downstream, min(ready_timeout, 15), name) as smoke:
                refused(smoke, name)
    except SmokeFailure as e:
        print(f"deploy-smoke: FAILED: {e}", flush=True)
        print(f"deploy-smoke: logs and the played YAML in {WORKDIR.relative_to(ROOT)}/", file=sys.stderr)
        return 1
    finally:
        downstream.proc.terminate()
        pg.pg("stop")
    print(f"deploy-smoke: passed in {time.monotonic() - step.t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
