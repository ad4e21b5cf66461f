"""The `relay` phase: drains of rows inserted at once, then the end-to-end peak of the ingest
with a relay draining; and the `peer` phase: graphile-worker on bench_peer."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from .common import CFG, DRAIN_ORDER0, LOGS, OUT, TRACEPARENT, BenchError
from .common import clean_env, log, popen, ratio, read_lines, stop
from .db import PEER, PRODUCT, Session
from .db_cpu import Split, brief, per_unit
from .services import Bench, Service, parse_summary, provider_run


def machine_cpu() -> tuple[int, int]:
    """The machine's CPU ticks: busy (all but idle and iowait), total."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def drain(bench: Bench, session: Session, relays: list[Service], n: int, tag: str) -> dict:
    """`relay_rows` pending commands inserted in one transaction with a NOTIFY while the
    relays run idle; the clock starts at the commit and stops when no row is pending."""
    rows, first = CFG["relay_rows"], DRAIN_ORDER0 + n * 1_000_000
    bench.reset_downstream()
    session.query(f"""BEGIN;
INSERT INTO outbox (kind, payload, idempotency_key, event_id, order_id, trace_context)
SELECT k.kind, jsonb_build_object('v', 1, 'order_id', o, 'event_id', 'evt_' || o),
       k.prefix || '-' || o, 'evt_' || o, o, '{TRACEPARENT}'
FROM generate_series({first}, {first + rows // 2 - 1}) o,
     (VALUES ('ship_order', 'ship'), ('send_confirmation', 'conf')) AS k(kind, prefix);
NOTIFY outbox_pending;""", timeout=120)
    pids = {"downstream": bench.downstream.pid, **{f"relay {r.tag}": r.p.pid for r in relays}}
    split = Split(bench, PRODUCT, pids, exclude={session.backend_pid()}).start()
    t0 = time.monotonic()  # the rows become visible with this commit
    session.query("COMMIT;")
    try:
        follow_drain(bench, session, rows, t0, t0 + 300, tag)
    finally:
        secs = time.monotonic() - t0
        cpu = per_unit(split.stop(), rows)
    log(f"  drain {tag}: {rows:,} rows in {secs:.2f}s = {rows / secs:,.0f} rows/s; "
        f"cpu us per row: {brief(cpu)}")
    return {"rows": rows, "seconds": round(secs, 3), "rows_per_s": round(rows / secs, 1),
            "cpu_us_per_row": cpu}


def follow_drain(bench: Bench, session: Session, rows: int, t0: float, deadline: float,
                 tag: str, tick=None) -> list:
    """Follows a drain of `rows` begun at `t0`: the simulator's counters until every row had
    its effect (`tick(seconds)` between samples), then the database until none is pending.
    The effects over time: [[seconds, effects]]."""
    curve = [[0.0, 0]]
    while time.monotonic() < deadline and curve[-1][1] < rows:
        if tick:
            tick(curve[-1][0])
        time.sleep(0.02)
        curve.append([round(time.monotonic() - t0, 3), bench.stats()["effects"]])
    what = f"drain {tag} ({curve[-1][1]:,} effects)"
    session.wait_drained(max(0.0, deadline - time.monotonic()), what, 0.005)
    return curve


def run(bench: Bench) -> None:
    # Outbox with its done history only; vacuumed once, before the first drain.
    bench.db.reset_product(CFG["product_history"])
    bench.relays.append(relay := bench.start_relay("a"))
    session = Session(bench.db, PRODUCT)
    try:
        drains = [drain(bench, session, [relay], i, f"{i + 1}/3 (one relay)") for i in range(3)]
        # Two relays start from the state the first drain did (vacuumed).
        session.query("VACUUM ANALYZE outbox; CHECKPOINT;", timeout=300)
        bench.relays.append(relay_b := bench.start_relay("b"))
        two = drain(bench, session, [relay, relay_b], 3, "two relays")
        bench.rss["relay_b"] = relay_b.rss()
        relay_b.stop()
    finally:
        session.close()
    bench.details["relay"] = {"drains_one_relay": drains, "two_relays": two}
    rates = [d["rows_per_s"] for d in drains]
    bench.report.update(relay_rows_per_s_1=rates[0], relay_rows_per_s_2=two["rows_per_s"],
                        relay_drain_rows_per_s=rates,
                        relay_decay_ratio=round(min(rates) / max(rates), 3))
    if bench.ingest:
        bench.details["relay"]["ingest_c64_with_relay"] = end_to_end_peak(bench)


def end_to_end_peak(bench: Bench) -> dict:
    """The ingest at 64 senders with a relay delivering, then until nothing is pending: the
    webhooks answered and delivered per second of all the cores (`e2e_peak_rps`)."""
    bench.reset()
    busy0, total0 = machine_cpu()
    t0 = time.monotonic()
    out = provider_run(bench.ingest, "c64-with-relay", concurrency=64, secs=CFG["peak_secs"])
    session = Session(bench.db, PRODUCT)
    try:
        session.wait_drained(300, "the relay after the 64-sender run", every=0.01)
    finally:
        session.close()
    secs, (busy1, total1), cores = time.monotonic() - t0, machine_cpu(), os.cpu_count() or 1
    busy = round((busy1 - busy0) / max(total1 - total0, 1) * cores, 2)
    # Per second of all the cores: the drain after the load leaves some idle.
    out["e2e_peak_rps"] = round(out["deliveries"] / secs * cores / max(busy, 0.01), 1)
    bench.report.update(ingest_rps_c64_with_relay=out["requests_per_s"],
                        ingest_p99_ms_c64_with_relay=out["p99_ms"],
                        e2e_peak_rps=out["e2e_peak_rps"])
    log(f"  c64 with a relay: {out['requests_per_s']:,.0f} req/s; all delivered after "
        f"{secs:.2f}s, {busy} of {cores} cores busy: end-to-end peak {out['e2e_peak_rps']:,.0f}")
    return out


def peer_drain(bench: Bench, tag: str, extra: list, pids: dict[str, int], jobs: int) -> dict:
    """One peer run: its jobs queued, then drained inside a CPU split."""
    args = ["node", "peer.js", "--jobs", jobs, "--concurrency", 24, "--wait", *extra]
    p = popen(args, cwd=OUT / "peer", env=clean_env({"DATABASE_URL": bench.db.url(PEER)}),
                    text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE)
    try:
        line = read_lines(p, lambda _: True, timeout=300)[0][0]
        if '"queued"' not in line:
            raise BenchError(f"{tag}: expected its queued line, got {line!r}")
        split = Split(bench, PEER, pids).start()
        out, err = p.communicate("go\n", timeout=600)
        cpu = split.stop()
    except subprocess.TimeoutExpired:
        raise BenchError(f"{tag} did not finish within 600s")
    finally:
        stop(p)
    (LOGS / f"{tag}.log").write_text(line + out + err)
    if p.returncode != 0:
        raise BenchError(f"{tag} exited {p.returncode}: {(err or out).strip()[-2000:]}")
    res = parse_summary(out, tag)
    # The node process's CPU over the drain alone, as it measured it.
    cpu["cpu_secs"]["peer (node)"] = res.get("drain_cpu_secs", 0.0)
    res["cpu_us_per_job"] = per_unit(cpu, jobs)
    return res


def run_peer(bench: Bench) -> None:
    if bench.peer_error:
        raise BenchError(bench.peer_error)
    jobs, r = CFG["peer_jobs"], bench.report
    noop = bench.details["peer"] = peer_drain(bench, "peer", [], {}, jobs)
    # Like for like with the relay's drain: each job POSTs to the same zero-latency
    # downstream, with an idempotency key and the relay's body.
    bench.reset_downstream()
    http = bench.details["peer_http"] = peer_drain(bench, "peer-http", [
        "--http", bench.downstream_url], {"downstream": bench.downstream.pid}, jobs)
    b = bench.details["relay_bound"] = relay_bound(bench, noop, http)
    relay = r.get("relay_rows_per_s_1")
    r.update(peer_jobs_per_s=noop["jobs_per_s"], relay_vs_peer=ratio(relay, noop["jobs_per_s"]),
             peer_http_jobs_per_s=http["jobs_per_s"],
             relay_vs_peer_http=ratio(relay, http["jobs_per_s"]),
             relay_vs_peer_ceiling=b.get("ceiling"))
    log(f"  peer (graphile-worker {noop.get('version')}), {jobs:,} jobs: no-op "
        f"{noop['jobs_per_s']:,} jobs/s, each a POST {http['jobs_per_s']:,} jobs/s; relay/peer "
        f"ceiling {b.get('ceiling')} (model {b.get('model')}, measured {r['relay_vs_peer']})")


def relay_bound(bench: Bench, peer: dict, http: dict) -> dict:
    """What one relay can reach against the no-op peer on these cores: `model`, the inverse
    ratio of CPU per row; `ceiling`, a relay costing no more than the peer's no-op job plus
    the downstream's own CPU for the call each row is."""
    drains = (bench.details.get("relay") or {}).get("drains_one_relay") or []
    ours = drains[0]["cpu_us_per_row"] if drains else {}
    noop = peer["cpu_us_per_job"]
    if not ours.get("total") or not noop.get("total"):
        return {}
    return {"relay_us_per_row": ours, "peer_us_per_job": noop,
            "peer_http_us_per_job": http["cpu_us_per_job"],
            "model": round(noop["total"] / ours["total"], 3),
            "ceiling": round(noop["total"] / (noop["total"] + ours.get("downstream", 0.0)), 3)}
