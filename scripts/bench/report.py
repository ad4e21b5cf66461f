"""The report: the targets and whether each is met, the tables printed at
the end and written to report.md, and report.json with every key."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

from . import plots
from .common import hlabel
from .config import CONCURRENCIES, E2E_RATE, OUT, T0

if TYPE_CHECKING:
    from .runner import Bench


TARGETS = [
    # key, comparison, threshold, what the targets say
    ("ingest_vs_reference_c64", ">=", 1.0, "ingest at 64 clients >= the naive reference (pgbench); the median of 3 alternated pairs"),
    ("ingest_vs_one_statement_c64", ">=", 0.8,
     "as close as possible to the one-statement reference (goal: 0.8)"),
    ("relay_vs_peer", ">=", 0.8, "relay drain >= 0.8 x graphile-worker's no-op jobs (the queue's own limit)"),
    ("relay_vs_peer_http", ">=", 1.0, "relay drain >= graphile-worker doing the same POST per job"),
    ("relay_decay_ratio", ">=", 0.9, "three back-to-back drains within 10% of each other"),
    ("ingest_p99_ms_half_load", "<=", 20.0, "p99 ingest latency at half of peak <= 20 ms (the ingest's peak)"),
    ("ingest_p99_ms_half_load_with_relay", "<=", 20.0,
     "the same while a relay drains (half of the peak of the ingest and a relay together)"),
    ("ingest_p99_ms_during_prune", "<=", 20.0, "the same while the prune deletes (the ingest's peak)"),
    ("e2e_p50_ms_idle", "<=", 50.0, "webhook accepted -> downstream called, p50 idle <= 50 ms"),
    ("e2e_p99_ms_load", "<=", 100.0,
     "the same, p99 at half of peak <= 100 ms (the peak of the ingest and a relay together)"),
    ("db_cpu_vs_naive", "<=", 0.5, "Postgres CPU per accepted webhook end to end <= 0.5x the naive design"),
    ("ingest_fresh_vs_steady", ">=", 0.9,
     "a new ingest's first 15 s at 64 senders on a just-migrated database >= 0.9x the steady state's"),
    ("relay_drain_flatness_fresh", ">=", 0.8,
     "a new relay over the fresh ingest's backlog: first and last tenth of the rows within 20% of each other"),
    ("relay_drain_flatness_outage", ">=", 0.8,
     "the same over 500k rows due at once after an outage, on six days of history"),
    ("ingest_rss_mib", "<=", 64.0, "ingest RSS under load <= 64 MiB"),
    ("relay_rss_mib", "<=", 64.0, "relay RSS under load <= 64 MiB"),
]


REQUIRED = ["ingest_rps_c1", "ingest_rps_c16", "ingest_rps_c64", "reference_tps_c64", "ingest_vs_reference_c64",
            "one_statement_tps_c64", "ingest_vs_one_statement_c64", "relay_decay_ratio",
            "ingest_p99_ms_half_load", "ingest_p99_ms_half_load_with_relay", "ingest_p99_ms_during_prune",
            "relay_rows_per_s_1", "relay_rows_per_s_2", "peer_jobs_per_s",
            "relay_vs_peer", "relay_vs_peer_http", "e2e_peak_rps", "e2e_p50_ms_idle", "e2e_p99_ms_load", "ingest_rss_mib",
            "relay_rss_mib",
            "ingest_rps_c64_10m_history", "db_cpu_us_per_webhook", "db_cpu_us_per_webhook_naive",
            "db_cpu_us_per_webhook_limit", "db_cpu_vs_naive", "ingest_fresh_vs_steady", "relay_drain_flatness_fresh",
            "relay_drain_flatness_outage"]


def targets(r: dict) -> list[dict]:
    out = []
    for key, op, threshold, what in TARGETS:
        v = r.get(key)
        met = None if v is None else (v >= threshold if op == ">=" else v <= threshold)
        out.append({"key": key, "value": v, "target": f"{op} {threshold:g}", "met": met, "spec": what})
    return out


def fmt(v, digits: int = 0) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, (int, float)):
        if digits == 0 and abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:,.{max(digits, 1) if abs(v) < 100 else digits}f}"
    return str(v)


def tables(r: dict, md: bool) -> str:
    def table(headers: list[str], rows: list[list[str]]) -> str:
        if md:
            lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
            lines += ["| " + " | ".join(row) + " |" for row in rows]
            return "\n".join(lines)
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
        line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
        out = [line, "  ".join("-" * w for w in widths)]
        out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
        return "\n".join(out)

    m = r.get("machine", {})
    s = m.get("postgres_settings", {})
    parts = []
    head = (f"make bench ({r['mode']}), {m.get('cores')} cores ({m.get('cpu_model', '')}), "
            f"{(m.get('memory_mib') or 0) / 1024:.1f} GiB, Linux {m.get('kernel')}, PostgreSQL "
            f"{m.get('postgres_version')} (fsync={s.get('fsync')}, synchronous_commit={s.get('synchronous_commit')}, "
            f"full_page_writes={s.get('full_page_writes')}, wal_sync_method={s.get('wal_sync_method')}, "
            f"shared_buffers={s.get('shared_buffers')}, ssl={s.get('ssl_in_use')}), load average at start "
            f"{m.get('load_average_at_start')}, at end {m.get('load_average_at_end')}, commit {m.get('commit')}")
    parts.append(head if not md else f"_{head}_")

    rows = []
    for c in CONCURRENCIES:
        rows.append([f"{c}", fmt(r.get(f"ingest_rps_c{c}")),
                     f"{fmt(r.get(f'ingest_p50_ms_c{c}'), 2)} / {fmt(r.get(f'ingest_p99_ms_c{c}'), 2)}",
                     fmt(r.get(f"reference_tps_c{c}")),
                     f"{fmt(r.get(f'reference_p50_ms_c{c}'), 2)} / {fmt(r.get(f'reference_p99_ms_c{c}'), 2)}",
                     fmt(r.get(f"one_statement_tps_c{c}")),
                     fmt(r.get(f"ingest_vs_reference_c{c}"), 2), fmt(r.get(f"ingest_vs_one_statement_c{c}"), 2)])
    parts.append(("**Ingest** " if md else "INGEST ")
                 + f"(closed loop, signed, 10% duplicates, {r['config']['ingest_secs']:g} s each; "
                   "pgbench -M prepared at the same concurrency)")
    parts.append(table(["senders", "ours req/s", "ours p50/p99 ms", "naive tps", "naive p50/p99 ms",
                        "one-stmt tps", "vs naive", "vs one-stmt"], rows))
    if r.get("ingest_vs_reference_c64_min") is not None:
        parts.append("At 64 senders, vs naive is the median of 3 alternated pairs of runs (range "
                     f"{fmt(r.get('ingest_vs_reference_c64_min'), 2)} to {fmt(r.get('ingest_vs_reference_c64_max'), 2)}; "
                     "the first pair, the req/s and tps above: "
                     f"{fmt(r.get('ingest_vs_reference_c64_first_pair'), 2)}).")

    rows = [
        ["ingest p99 at half of peak (open loop)", f"{fmt(r.get('ingest_p99_ms_half_load'), 2)} ms",
         f"at {fmt(r.get('half_load_rps'))} req/s; p50 {fmt(r.get('ingest_p50_ms_half_load'), 2)} ms"
         + "".join(f"; {n:,} answered {code}" for code, n in (r.get("half_load_status_counts") or {}).items()
                   if code != "200")],
        ["ingest at 64 senders, a relay draining", f"{fmt(r.get('ingest_rps_c64_with_relay'))} req/s",
         f"p99 {fmt(r.get('ingest_p99_ms_c64_with_relay'), 2)} ms; the ingest runs above have no relay"],
        ["end-to-end peak (ingest and relay together)", f"{fmt(r.get('e2e_peak_rps'))} webhooks/s",
         "answered and delivered, per second of all the cores (the run above until nothing is pending)"],
        ["ingest p99 at half of the end-to-end peak, relay draining",
         f"{fmt(r.get('ingest_p99_ms_half_load_with_relay'), 2)} ms",
         f"the e2e load run, at {fmt(r.get('e2e_load_rps'))} req/s"],
        [f"ingest p99 at half of peak, prune deleting {fmt(r.get('prune_rows'))} rows",
         f"{fmt(r.get('ingest_p99_ms_during_prune'), 2)} ms",
         f"without the prune {fmt(r.get('ingest_p99_ms_baseline_prune'), 2)} ms; p50 "
         f"{fmt(r.get('ingest_p50_ms_baseline_prune'), 2)} -> {fmt(r.get('ingest_p50_ms_during_prune'), 2)} ms; "
         f"prune {fmt(r.get('prune_secs'), 1)} s = {fmt(r.get('prune_rows_per_s'))} rows/s "
         f"at {fmt(r.get('prune_load_rps'))} req/s"],
        ["e2e accepted -> downstream, idle", f"p50 {fmt(r.get('e2e_p50_ms_idle'), 1)} / p99 "
                                              f"{fmt(r.get('e2e_p99_ms_idle'), 1)} ms",
         f"{r['config']['e2e_idle_events']} events at {E2E_RATE:g}/s"],
        ["e2e accepted -> downstream, half of the end-to-end peak", f"p50 {fmt(r.get('e2e_p50_ms_load'), 1)} / p99 "
                                                                    f"{fmt(r.get('e2e_p99_ms_load'), 1)} ms",
         f"at {fmt(r.get('e2e_load_rps'))} req/s"],
        ["the same at half of the ingest's peak", f"p99 {fmt(r.get('e2e_p99_ms_half_ingest_peak'), 1)} ms",
         f"at {fmt(r.get('e2e_half_ingest_peak_rps'))} req/s, ingest p99 "
         f"{fmt(r.get('ingest_p99_ms_half_ingest_peak_with_relay'), 2)} ms: more than a relay can follow "
         "on the same cores"],
        ["relay drain, one relay", f"{fmt(r.get('relay_rows_per_s_1'))} rows/s",
         f"{r['config']['relay_rows']:,} rows, zero-latency downstream"],
        ["relay drain, two relays", f"{fmt(r.get('relay_rows_per_s_2'))} rows/s", ""],
        ["relay drain, log line per call on / off", f"{fmt(r.get('relay_rows_per_s_log_line_on'))} / "
                                                    f"{fmt(r.get('relay_rows_per_s_log_line_off'))} rows/s",
         f"on/off {fmt(r.get('relay_log_line_drain_ratio'), 3)} (relay cpu on/off "
         f"{fmt(r.get('relay_log_line_cpu_ratio'), 3)}); off is RUST_LOG=warn; "
         f"{r['config'].get('log_line_rows', 0):,} rows per drain, on, off, off, on"],
        ["peer (graphile-worker, batching, concurrency 24)", f"{fmt(r.get('peer_jobs_per_s'))} jobs/s",
         f"relay/peer {fmt(r.get('relay_vs_peer'), 2)}"],
        ["peer, each job a POST to the downstream", f"{fmt(r.get('peer_http_jobs_per_s'))} jobs/s",
         f"relay/peer {fmt(r.get('relay_vs_peer_http'), 2)}"],
        ["three drains, no VACUUM between", " / ".join(fmt(x) for x in r.get("relay_drain_rows_per_s", [])),
         f"slowest/fastest {fmt(r.get('relay_decay_ratio'), 2)}"],
        ["Postgres CPU per webhook, end to end", f"{fmt(r.get('db_cpu_us_per_webhook'), 1)} us",
         f"ingest answering and a relay delivering, at {fmt(r.get('db_cpu_rps'))} req/s; per new event "
         f"{fmt(r.get('db_cpu_us_per_new_event'), 1)} us; every server process, until nothing is pending"],
        ["the same, naive / one-statement designs", f"{fmt(r.get('db_cpu_us_per_webhook_naive'), 1)} / "
                                                    f"{fmt(r.get('db_cpu_us_per_webhook_limit'), 1)} us",
         f"ours/naive {fmt(r.get('db_cpu_vs_naive'), 2)}, ours/one-stmt {fmt(r.get('db_cpu_vs_limit'), 2)}; "
         "pgbench ingest@25 + relay@1 at the same rate"],
        ["peak RSS (VmHWM)", f"ingest {fmt(r.get('ingest_rss_mib'), 1)} / relay {fmt(r.get('relay_rss_mib'), 1)} MiB",
         f"after the load phases (ingest after the closed-loop runs only: "
         f"{fmt(r.get('ingest_rss_mib_closed_loop'), 1)} MiB)"],
        ["tracing overhead (64 senders, OTLP to a local sink)", f"{fmt(r.get('tracing_overhead_pct'), 1)} %",
         f"{fmt(r.get('ingest_rps_c64_traced'))} req/s traced"],
    ]
    for h in r.get("growth_history_sizes", []):
        label = hlabel(h)
        rows.append([f"c64 with {h:,} processed events, {r['config']['growth_outbox_done']:,} done rows",
                     f"{fmt(r.get(f'ingest_rps_c64_{label}_history'))} req/s",
                     f"p99 {fmt(r.get(f'ingest_p99_ms_c64_{label}_history'), 2)} ms; claim "
                     f"{fmt(r.get(f'claim_ms_{label}_history'), 3)} ms (nothing due "
                     f"{fmt(r.get(f'claim_ms_idle_{label}_history'), 3)} ms)"])
    rows += [
        [f"ingest at 64 senders, first {r['config'].get('fresh_secs', 0):g} s on a just-migrated database",
         f"{fmt(r.get('ingest_fresh_rps'))} req/s",
         f"p99 {fmt(r.get('ingest_p99_ms_fresh'), 2)} ms; steady state {fmt(r.get('ingest_steady_rps'))} req/s "
         f"on the same database: fresh/steady {fmt(r.get('ingest_fresh_vs_steady'), 2)}"],
        ["relay drain, a new relay over the fresh ingest's backlog", f"{fmt(r.get('relay_fresh_rows_per_s'))} rows/s",
         f"{fmt(r.get('relay_fresh_rows'))} rows; first and last tenth, slower/faster: "
         f"{fmt(r.get('relay_drain_flatness_fresh'), 2)}"],
        ["relay drain after an outage", f"{fmt(r.get('relay_outage_rows_per_s'))} rows/s",
         f"{fmt(r.get('relay_outage_rows'))} due rows on six days of history; first and last tenth, slower/faster: "
         f"{fmt(r.get('relay_drain_flatness_outage'), 2)}; the peer over as many no-op jobs "
         f"{fmt(r.get('peer_outage_jobs_per_s'))} jobs/s"],
    ]
    parts.append("**Latency, relay, memory, growth**" if md else "LATENCY, RELAY, MEMORY, GROWTH")
    parts.append(table(["figure", "value", "context"], rows))

    rows = [[t["key"], fmt(t["value"], 2), t["target"],
             {True: "met", False: "NOT MET", None: "n/a"}[t["met"]]] for t in r.get("targets", [])]
    parts.append("**Targets**" if md else "TARGETS")
    parts.append(table(["key", "value", "target", ""], rows))
    if md:
        parts.append("\n".join(f"- {n}" for n in r.get("notes", [])
                                + ([r["prune_note"]] if r.get("prune_note") else [])
                                + ([r["growth_note"]] if r.get("growth_note") else [])
                                + ([r["growth_cut"]] if r.get("growth_cut") else [])))
    rows = bounds(r)
    if rows:
        parts.append("**What bounds the ratios** (CPU by process, us per unit of work)" if md
                     else "WHAT BOUNDS THE RATIOS (CPU by process, us per unit of work)")
        parts.append(table(["figure", "ours", "theirs", "measured / model / ceiling"], rows))
    if md and r.get("plots"):
        parts.append("**Plots**")
        parts.append("\n\n".join(f"![{p['title']}]({p['file']})" for p in r["plots"]))
    phases = ", ".join(f"{k} {v:g}s" for k, v in r.get("phase_secs", {}).items())
    parts.append(f"Phases: {phases}; total {r.get('total_secs')} s.")
    if r.get("errors"):
        parts.append("ERRORS: " + "; ".join(f"{k}: {v}" for k, v in r["errors"].items()))
    return "\n\n".join(parts) + "\n"


def parts_of(u: dict | None) -> str:
    if not u:
        return "n/a"
    return ", ".join(f"{k} {fmt(v, 1)}" for k, v in u.items() if k not in ("cores_counted", "machine_cores_busy"))


def bounds(r: dict) -> list[list[str]]:
    """Rows of the CPU split behind the ratios the targets miss or straddle:
    the ingest against the one-statement reference at 64 senders, one relay
    against the no-op peer, the end-to-end database cost against the naive
    design."""
    d = r.get("details", {})
    rows = []
    c64 = (d.get("ingest") or {}).get(64) or (d.get("ingest") or {}).get("64")
    if c64 and c64.get("bound"):
        b = c64["bound"]
        rows.append(["ingest / one statement, 64 senders", parts_of(c64["ours"].get("cpu_us_per_request")),
                     parts_of(c64["one_statement"].get("cpu_us_per_transaction")),
                     f"{fmt(r.get('ingest_vs_one_statement_c64'), 2)} / {fmt(b.get('model'), 2)} / "
                     f"{fmt(b.get('ceiling'), 2)} (pgbench's client for ours: "
                     f"{fmt(b.get('ceiling_ingest_process_only'), 2)})"])
    b = d.get("relay_bound")
    if b:
        rows.append(["relay / no-op peer, per row", parts_of(b.get("relay_us_per_row")),
                     parts_of(b.get("peer_us_per_job")),
                     f"{fmt(r.get('relay_vs_peer'), 2)} / {fmt(b.get('model'), 2)} / {fmt(b.get('ceiling'), 2)} "
                     f"(database per row ours/peer {fmt(b.get('database_us_per_row_vs_peer'), 2)}; the peer's "
                     f"POST adds {fmt(b.get('peer_call_us_per_job'), 1)} us per job)"])
    if r.get("db_cpu_us_per_webhook_limit") is not None:
        rows.append(["Postgres CPU per webhook / naive", f"{fmt(r.get('db_cpu_us_per_webhook'), 1)}",
                     f"naive {fmt(r.get('db_cpu_us_per_webhook_naive'), 1)}, one-statement limit "
                     f"{fmt(r.get('db_cpu_us_per_webhook_limit'), 1)}",
                     f"{fmt(r.get('db_cpu_vs_naive'), 2)}; the limit design's own: "
                     f"{fmt(r.get('db_cpu_limit_vs_naive'), 2)}"])
    return rows


NOTES = [
    "Every ingest run (ours and pgbench's) starts from the same reset state; ours from a history of "
    "processed events and done outbox rows, vacuumed and analyzed, so prepared statements get their "
    "steady-state plans. No relay runs during the ingest runs (the references do not drain either), so "
    "the outbox's pending rows grow through each run; 'ingest at 64 senders, a relay draining' is the "
    "deployed shape.",
    "ours req/s counts every delivery (10% are duplicates, answered from the stored result); "
    "ingest_new_events_per_s_* counts first deliveries only.",
    "Relay drains: the rows are inserted in one transaction with a NOTIFY while the relay runs idle; the "
    "clock starts at COMMIT and stops when no row is pending (every effect seen at the simulator first). "
    "No VACUUM between the three one-relay drains; the two-relay drain follows a VACUUM ANALYZE.",
    "Retention under load: the prune phase makes old done outbox rows and processed events (past "
    "RETENTION_DAYS), vacuums and checkpoints, then runs the ingest at half of peak (open loop, no relay) "
    "for a baseline window and again while `outbox-relay prune` deletes them (250 rows per statement, "
    "resting as long again after each, outbox first); that window starts 0.5 s before the prune and stops when it exits. Before each window "
    "every order is pending again and the outbox has no pending row (vacuumed, checkpointed). prune_secs "
    "is the prune process's wall time; details.prune has, per window, the WAL written and checkpoints "
    "(cluster-wide), autovacuums of the two tables and what the ingest's backends waited on "
    "(pg_stat_activity sampled every 0.2 s).",
    "End to end: effect_at_ms (the simulator's clock, whole milliseconds, floored) minus the time the "
    "sender (simulator provider, 20 events/s on a schedule) read the 200, also in whole milliseconds; "
    "figures are +-1 ms.",
    "Postgres CPU per webhook (db_cpu): utime + stime from /proc of every process of the server (and the "
    "postmaster's cutime + cstime for those that exited) over a window from the load's start until no outbox "
    "row is pending; ours per webhook answered (duplicates included; per new event beside), the references "
    "per ingest transaction, run by pgbench at the rate ours answered, ingest and relay scripts weighted 25:1; "
    "two rounds (ours, naive, limit, then limit, naive, ours), added up; details.db_cpu.ratio_per_round has both. "
    "The services' own CPU and the bench's polling session are not counted; details.db_cpu has the split.",
    "Fresh and outage: new services over a standing state. The fresh run is a new ingest's first "
    "fresh_secs on a just-migrated database (the product's tables empty, never analyzed by the bench); the "
    "steady run the same on that database a minute later, from the history every ingest run starts from. "
    "Drains: a new relay spawned over rows already due, the downstream's effects sampled every 20-150 ms; "
    "flatness is the slower of the rates over the first and the last tenth of the rows over the faster, "
    "from the first effect seen. details.fresh and details.outage have each table's scans, autovacuum and "
    "autoanalyze runs, the WAL and the checkpoints of each window.",
    "The provider, pgbench, the OTLP sink and the simulator run on the same machine as the product and "
    "Postgres: their CPU is part of every figure, as the load average at start shows what else ran.",
]


def write_report(bench: Bench) -> dict:
    r = bench.report
    r["notes"] = NOTES
    r["targets"] = targets(r)
    r["phase_secs"] = bench.phases
    r["total_secs"] = round(time.monotonic() - T0, 1)
    if "machine" in r:
        r["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    r["errors"] = bench.errors
    r["missing_keys"] = [k for k in REQUIRED if r.get(k) is None]
    r["details"] = bench.details
    r["generated_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "report.json").write_text(json.dumps(r, indent=2) + "\n")
    # Drawn from report.json, then named in it and linked from report.md;
    # not after a Ctrl-C (the first run installs matplotlib).
    r["plots"] = [] if "interrupted" in bench.errors else plots.draw(OUT / "report.json", OUT)
    (OUT / "report.json").write_text(json.dumps(r, indent=2) + "\n")
    (OUT / "report.md").write_text(tables(r, md=True))
    return r
