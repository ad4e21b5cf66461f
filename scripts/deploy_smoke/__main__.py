"""`make deploy-smoke` (through scripts/deploy-smoke.sh): the steps, then three renders
broken on purpose that it must refuse, each for its reason. The render, the pods and
the shim are pods.py's; what the binaries do with the traffic, the integration tests'."""

import itertools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import closing
from urllib.parse import urlsplit

from .pods import ROOT, WORKDIR, Render, SmokeFailure, Workload, podman, remove_pods, run, until

INGEST, RELAY = "webhook-ingest", "outbox-relay"
SIMULATOR = ROOT / "target" / os.environ.get("IMAGES_PROFILE", "release") / "simulator"
PG = str(ROOT / "scripts/pg-cluster.sh")  # the smoke's own Postgres (deploy-smoke.sh)
EVENTS = 200  # enough for duplicates, bursts and refunds to occur
# The rows whose downstream calls are under way at the relay's SIGTERM, and how slow they are.
IN_FLIGHT_EVENTS, SLOW_DOWNSTREAM_MS = 40, 1500
READY_SECS = float(os.environ.get("DEPLOY_SMOKE_READY_SECS", 60))
T0, STEP = time.monotonic(), itertools.count(1)


def step(title: str) -> None:
    print(f"[{next(STEP)}/9, {time.monotonic() - T0:.0f} s] {title}", flush=True)


def psql(url: str, *statements: str) -> str:
    """Each statement in a transaction of its own."""
    return run("psql", "-X", "-qAt", "-v", "ON_ERROR_STOP=1",
               *[arg for sql in statements for arg in ("-c", sql)], "-d", url, timeout=60)


def downstream() -> tuple[subprocess.Popen, str]:
    """The simulated fulfilment and email APIs (crates/simulator), on the host's loopback."""
    log = (WORKDIR / "downstream.log").open("w")
    proc = subprocess.Popen([str(SIMULATOR), "downstream", "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    if not (line := proc.stdout.readline()):
        raise SmokeFailure(f"the simulated downstream did not start (see {log.name})")
    return proc, f"http://{json.loads(line)['listening']}"


class Smoke:
    def __init__(self, admin_url: str, downstream_url: str, ready_secs: float, broken: str = ""):
        self.admin_url, self.downstream_url = admin_url, downstream_url
        self.ready_secs, self.running = ready_secs, {}
        self.render = Render(ROOT / "deploy/overlays/dev", secrets.token_hex(16))
        if broken:
            BREAKS[broken][0](self.render.get("Deployment", INGEST)["spec"]["template"]["spec"]
                              ["containers"][0])
        self.render.stand_ins(urlsplit(admin_url).port, urlsplit(downstream_url).port)

    def close(self) -> None:
        for w in self.running.values():
            w.down()
        for name in self.render.secrets:
            podman("secret", "rm", name, check=False)
        remove_pods()

    def sql(self, query: str) -> str:
        return psql(self.admin_url.rsplit("/", 1)[0] + "/" + self.db, query)

    def migrated(self) -> None:
        """The Secrets; the role and database their URLs name, made afresh (the overlay's
        Postgres StatefulSet makes them); the migration Job's pod, to completion."""
        self.render.create_secrets()
        port = urlsplit(self.admin_url).port
        urls = {urlsplit(v) for values in self.render.secrets.values() for v in values.values()}
        wanted = {(u.path.lstrip("/"), u.username, u.password) for u in urls if u.port == port}
        if len(wanted) != 1:
            raise SmokeFailure(f"the Secrets name {len(wanted)} databases on the smoke's Postgres")
        [(self.db, user, password)] = wanted
        psql(self.admin_url, f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)',
             f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{user}') "
             f'THEN CREATE ROLE "{user}" LOGIN CREATEROLE; END IF; END $$',
             f"SET log_statement = 'none'; ALTER ROLE \"{user}\" PASSWORD '{password}'",
             f'CREATE DATABASE "{self.db}" OWNER "{user}"')
        self.sql("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        job = Workload(self.render, "Job", self.render.get("Job")["metadata"]["name"])
        self.running["job"] = job
        job.play()
        code, logs = int(podman("wait", job.ctr, timeout=300).split()[-1]), job.logs()
        self.running.pop("job").down()
        if code != 0:
            raise SmokeFailure(f"{job.owner}: exited with {code} (the Job retries, then fails):\n{logs}")

    def start(self, name: str) -> None:
        """Played; Ready by its readiness probe; live by its liveness probe."""
        w = self.running[name] = Workload(self.render, "Deployment", name)
        w.play()
        w.wait(w.readiness, True, self.ready_secs)
        w.wait(w.liveness, True, w.liveness["periodSeconds"] * w.liveness["failureThreshold"])

    def stop(self, name: str) -> None:
        self.running[name].stop()
        self.running.pop(name).down()

    def ingest_url(self) -> str:
        """kube-proxy's part: the Service's targetPort on the pod its selector picks."""
        svc, w = self.render.get("Service", INGEST), self.running[INGEST]
        labels = w.obj["spec"]["template"]["metadata"].get("labels") or {}
        selector = svc["spec"].get("selector") or {}
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            raise SmokeFailure(f"Service {INGEST} selects {selector}, which {w.owner}'s pods lack")
        target = svc["spec"]["ports"][0].get("targetPort", svc["spec"]["ports"][0]["port"])
        port = w.named_ports.get(target) if isinstance(target, str) else target
        if port not in w.ports:
            raise SmokeFailure(f"Service {INGEST} targets port {target}, which the container lacks")
        return f"http://127.0.0.1:{w.ports[port]}"

    def provider(self, events: int, run_id: str, *extra: str) -> None:
        """Webhooks for orders made here, signed with the Secret's WEBHOOK_SECRETS, sent
        through the Service: each must be acknowledged."""
        first = int(self.sql("SELECT coalesce(max(id), 0) + 1 FROM orders"))
        self.sql(f"INSERT INTO orders (id, payment_id) SELECT n, 'pay_' || n "
                 f"FROM generate_series({first}, {first + events - 1}) n")
        secret = self.render.secrets[INGEST]["WEBHOOK_SECRETS"].split(",")[0].strip()
        run(str(SIMULATOR), "provider", "--target", self.ingest_url(), "--secret", secret,
            "--events", str(events), "--orders", str(events), "--first-order", str(first),
            "--run-id", run_id, "--no-progress", "--timeout-ms", "5000", "--give-up-after-ms",
            "60000", *extra)

    def drain(self) -> None:
        pending = "SELECT count(*) FROM outbox WHERE status = 'pending'"
        until("every outbox row delivered", lambda: self.sql(pending) == "0", 90)

    def slow_downstream(self, ms: int) -> None:
        faults = json.dumps({"latency_ms": str(ms)} if ms else {}).encode()
        request = urllib.request.Request(f"{self.downstream_url}/control/faults", faults,
                                         {"content-type": "application/json"})
        urllib.request.urlopen(request, timeout=10).read()


def full(s: Smoke) -> None:
    step("deploy/overlays/dev rendered; its Secrets and database; the migration Job, to completion")
    s.migrated()
    step("webhook-ingest and outbox-relay: podman kube play, Ready and live by their probes")
    for name in (INGEST, RELAY):
        s.start(name)
    step(f"{EVENTS} signed webhooks through the Service, delivered through the ConfigMap's URLs")
    s.provider(EVENTS, "smoke", "--rate", "100", "--duplicate-rate", "0.2", "--burst-rate", "0.05",
               "--refund-rate", "0.05", "--unmatched-rate", "0.02")
    s.drain()
    step("the database stopped: both unready, both live; started: both Ready again")
    run(PG, "stop")
    for w in s.running.values():
        r, live = w.readiness, w.liveness
        w.wait(r, False, r["periodSeconds"] * (r["failureThreshold"] + 1) + r["timeoutSeconds"] + 10)
        w.wait(live, True, live["periodSeconds"] * live["failureThreshold"])
    run(PG, "start")
    for w in s.running.values():
        w.wait(w.readiness, True, s.ready_secs)
    step(f"outbox-relay stopped with {SLOW_DOWNSTREAM_MS} ms downstream calls under way: exit 0 "
         "in its grace period, no row left leased; played again, it finishes the work")
    # What becomes of each row: outbox-relay's sigterm_exits_0_in_time_and_leaves_no_row_leased.
    s.slow_downstream(SLOW_DOWNSTREAM_MS)
    s.provider(IN_FLIGHT_EVENTS, "smoke_relay", "--concurrency", "8")
    leased = "SELECT count(*) FROM outbox WHERE status = 'pending' AND lease_owner IS NOT NULL"
    until("a row leased by the relay", lambda: s.sql(leased) != "0", 30)
    s.stop(RELAY)
    s.slow_downstream(0)
    if (left := s.sql(leased)) != "0":
        raise SmokeFailure(f"{left} rows still leased by the stopped relay")
    s.start(RELAY)
    s.drain()
    step("webhook-ingest and outbox-relay stopped as the kubelet stops them")
    for name in (INGEST, RELAY):
        s.stop(name)


# Renders broken on purpose, each of which the smoke must refuse for its reason
# (what a cluster would show): how webhook-ingest's container is broken; the reason.
BREAKS = {
    "readiness-port": (lambda c: c["readinessProbe"]["httpGet"].update(port=9999), "not Ready"),
    "root-user": (lambda c: c.setdefault("securityContext", {}).update(runAsUser=0), "runAsUser=0"),
    "missing-variable": (lambda c: c.update(env=[e for e in c["env"]
                                                 if e["name"] != "WEBHOOK_SECRETS"]), "exited with 2"),
}


def refused(s: Smoke, name: str) -> None:
    try:
        s.migrated()
        for workload in (INGEST, RELAY):
            s.start(workload)
    except SmokeFailure as e:
        if BREAKS[name][1] not in str(e):
            raise SmokeFailure(f"self-test {name}: failed, but not for its reason: {e}") from None
        print(f"    refused, as it must be: {e}", flush=True)
        return
    raise SmokeFailure(f"self-test {name}: the smoke passed a broken render")


def main() -> int:
    # SIGTERM (a CI job's timeout) unwinds like Ctrl-C: every pod is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    shutil.rmtree(WORKDIR, ignore_errors=True)  # the logs and played YAML of the last run only
    WORKDIR.mkdir(parents=True)
    remove_pods()
    admin_url = run(PG, "start").splitlines()[-1]
    proc, downstream_url = downstream()
    try:
        with closing(Smoke(admin_url, downstream_url, READY_SECS)) as smoke:
            full(smoke)
        for name in BREAKS:
            step(f"self-test: a broken render ({name}) must fail the smoke")
            # A broken pod need not take the whole ready timeout to be refused.
            with closing(Smoke(admin_url, downstream_url, min(READY_SECS, 15), name)) as smoke:
                refused(smoke, name)
    except SmokeFailure as e:
        print(f"deploy-smoke: FAILED: {e}\n(logs and the played YAML: target/deploy-smoke/)")
        return 1
    finally:
        proc.terminate()
        run(PG, "stop")
    print(f"deploy-smoke: passed in {time.monotonic() - T0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
