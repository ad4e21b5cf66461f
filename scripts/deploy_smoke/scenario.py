"""The smoke's steps: the migration Job, then the services started as a
kubelet starts them, webhooks through the Service's port, the database
stopped and started under them, and each stopped as a kubelet stops it with
work in flight."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

from .neighbours import ROOT, Lock
from .objects import SmokeFailure
from .smoke import INGEST, RELAY, SERVICES, Smoke, Steps, say

# The traffic: enough events for duplicates, bursts and refunds to occur.
EVENTS = 200
EVENTS_RATE = 100
# Rows whose downstream calls are under way when the relay is stopped, and
# how slow the downstream answers meanwhile.
IN_FLIGHT_EVENTS = 40
SLOW_DOWNSTREAM_MS = 1500
# Webhooks under way (held by a lock on `orders`) when the ingest gets SIGTERM.
IN_FLIGHT_WEBHOOKS = 8


# --- the whole run ---------------------------------------------------------------------

def full(smoke: Smoke, steps: Steps) -> None:
    s = smoke
    shown = s.o.overlay.relative_to(ROOT) if s.o.overlay.is_relative_to(ROOT) else s.o.overlay
    with steps.step(f"render {shown} (kubectl kustomize) and plan the pods from it"):
        s.plan()
    with steps.step("the database the Secrets name, on the smoke's Postgres"):
        s.database()
    with steps.step("the migration Job's container, to completion"):
        s.migrate()
    with steps.step("webhook-ingest and outbox-relay started as the kubelet would; cold start to ready"):
        for owner in SERVICES:
            s.start_service(owner)
    with steps.step(f"signed webhooks through the Service's port: one by hand and its replay, then {EVENTS} from the provider"):
        s.seed(1, EVENTS + 1)
        code, out = s.send(f"pay_{EVENTS + 1}", "evt_smoke_by_hand")
        again, out2 = s.send(f"pay_{EVENTS + 1}", "evt_smoke_by_hand")
        if code != 0 or again != 0 or "Idempotent-Replayed: true" not in out2:
            raise SmokeFailure(f"a webhook and its replay: {out!r} then {out2!r}")
        say(f"by hand: {out.splitlines()[0]}; again: {out2.splitlines()[0]}")
        p = s.provider(EVENTS, 1, "smoke", ["--rate", str(EVENTS_RATE), "--duplicate-rate", "0.2",
                                            "--burst-rate", "0.05", "--refund-rate", "0.05", "--unmatched-rate", "0.02"])
        say(f"provider: {p['events']} events, {p['deliveries']} deliveries ({p['duplicate_deliveries']} duplicates, "
            f"{p['burst_deliveries']} in bursts), all acknowledged")
        s.drain()
        s.audit("traffic")
        s.steady()
    with steps.step("the database stopped: both unready (readiness), none restarted (liveness); started: ready again"):
        database_down(s)
    with steps.step(f"outbox-relay stopped with {SLOW_DOWNSTREAM_MS} ms downstream calls under way; a new pod finishes the work"):
        relay_in_flight(s)
    with steps.step(f"webhook-ingest stopped with {IN_FLIGHT_WEBHOOKS} webhooks in flight"):
        ingest_in_flight(s)
    with steps.step("outbox-relay stopped, idle"):
        s.stop(RELAY)


def database_down(s: Smoke) -> None:
    order = int(s.sql("SELECT coalesce(max(id), 0) + 1 FROM orders"))
    s.seed(order, order)
    t0 = time.monotonic()
    s.cluster.stop()
    say("Postgres stopped (pg_ctl stop -m fast)")
    pods = [s.pod(o) for o in SERVICES]
    for pod in pods:
        r = pod.c.readiness
        pod.wait_unready(r.period * (r.failure_threshold + 1) + r.timeout + 10)
        say(f"{pod.c.owner} unready {time.monotonic() - t0:.1f} s after the stop ({pod.readiness.last})")
    code, out = s.send(f"pay_{order}", "evt_smoke_db_down")
    if code == 0:
        raise SmokeFailure(f"a webhook was accepted while the database was down: {out}")
    say(f"a webhook meanwhile: {out.splitlines()[0]} (the provider retries it)")
    for pod in pods:
        if pod.liveness and pod.liveness.failures:
            raise SmokeFailure(f"{pod.c.owner}: liveness failed {pod.liveness.failures} times while the database was down "
                               f"({pod.liveness.last}): a longer outage would have it restarted")
    s.cluster.start()
    t1 = time.monotonic()
    say("Postgres started")
    for pod in pods:
        r = pod.c.readiness
        pod.wait_ready(r.period * r.success_threshold + r.timeout + 30)
        say(f"{pod.c.owner} Ready again {time.monotonic() - t1:.1f} s after the start; liveness never failed")
    code, out = s.send(f"pay_{order}", "evt_smoke_db_down")
    if code != 0:
        raise SmokeFailure(f"the webhook refused during the outage, sent again: {out}")
    say(f"the same webhook again: {out.splitlines()[0]}")
    s.drain()


def relay_in_flight(s: Smoke) -> None:
    first = int(s.sql("SELECT coalesce(max(id), 0) + 1 FROM orders"))
    s.seed(first, first + IN_FLIGHT_EVENTS - 1)
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
    under_way = stats["requests"] - before
    leased = int(s.sql("SELECT count(*) FROM outbox WHERE status = 'pending' AND lease_owner IS NOT NULL"))
    if leased:
        raise SmokeFailure(f"{leased} rows still leased by the stopped relay: their calls wait for the lease to expire")
    keys = json.loads(urllib.request.urlopen(f"{s.downstream.url}/stats", timeout=10).read()).get("keys") or {}
    called = {k for k, v in keys.items() if v.get("effects")}
    rows = dict(line.split("|") for line in s.sql("SELECT idempotency_key, status FROM outbox").splitlines())
    unrecorded = sorted(k for k in called if rows.get(k) == "pending")
    if unrecorded:
        raise SmokeFailure(f"calls made but not recorded as done by the stopped relay: {unrecorded[:5]}")
    pending = int(s.sql("SELECT count(*) FROM outbox WHERE status = 'pending'"))
    say(f"{under_way} calls were under way at SIGTERM: each finished and recorded; "
        f"{pending} rows not yet started were released, none leased")
    s.start_service(RELAY, measure=False)
    s.drain()
    s.audit("relay-stop")


def ingest_in_flight(s: Smoke) -> None:
    first = int(s.sql("SELECT coalesce(max(id), 0) + 1 FROM orders"))
    s.seed(first, first + IN_FLIGHT_WEBHOOKS - 1)
    port = s.service_port(INGEST)
    state: dict = {}

    def waiting() -> int:
        return int(s.sql("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                         "AND datname = current_database()"))

    def hold_and_send() -> None:
        # Late in the preStop pause (the endpoints are gone, requests already
        # routed still arrive): webhooks that wait on a lock until after SIGTERM.
        state["lock"] = Lock(s.cluster.url(s.db))
        state["sends"] = [subprocess.Popen(
            [str(s.bindir / "simulator"), "send", f"pay_{first + i}", "--id", f"evt_smoke_inflight_{i}",
             "--target", f"http://127.0.0.1:{port}", "--secret", s.secret()],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(IN_FLIGHT_WEBHOOKS)]
        deadline = time.monotonic() + 10
        while waiting() == 0:
            if time.monotonic() > deadline:
                raise SmokeFailure("the webhooks never reached the database")
            time.sleep(0.02)

    def release_after_sigterm() -> None:
        time.sleep(1.0)
        state["waiting_at_sigterm"] = waiting()
        state["lock"].release()

    try:
        s.stop(INGEST, on_pre_stop=hold_and_send, after_sigterm=release_after_sigterm)
    except BaseException:
        for proc in state.get("sends", []):
            proc.kill()
        raise
    finally:
        if "lock" in state:
            state["lock"].release()
    answers = []
    for proc in state["sends"]:
        out, _ = proc.communicate(timeout=30)
        answers.append((proc.returncode, out.strip().splitlines()[0] if out.strip() else ""))
    refused = [a for a in answers if a[0] != 0]
    if refused:
        raise SmokeFailure(f"webhooks in flight at SIGTERM were not answered 2xx: {refused}")
    stored = int(s.sql("SELECT count(*) FROM processed_events WHERE event_id LIKE 'evt_smoke_inflight_%'"))
    if stored != IN_FLIGHT_WEBHOOKS:
        raise SmokeFailure(f"{IN_FLIGHT_WEBHOOKS} webhooks answered 200 but {stored} recorded")
    say(f"{IN_FLIGHT_WEBHOOKS} webhooks sent late in the preStop pause, held by a lock until 1 s after SIGTERM "
        f"({state['waiting_at_sigterm']} database session(s) waiting on it then): all answered {answers[0][1]!r}, all recorded")
    s.drain()
    s.audit("final")
