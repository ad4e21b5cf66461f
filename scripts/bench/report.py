"""The report: the targets and whether each is met, the tables printed at
the end and written to report.md, report.json with every key; and the
documents' generated parts, between `<!-- bench:NAME:begin -->` and
`<!-- bench:NAME:end -->`: docs/BENCHMARK.md's `phases` (runner.PHASES) and
`latest` run, and the README's quote of it, `summary`. Only a full run of
every phase without errors writes those (`python3 -m bench --docs` again)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from .common import hlabel
from .config import CONCURRENCIES, E2E_RATE, OUT, ROOT, T0
from .db_cpu import brief
from .services import Bench

TARGETS = [
    # key, comparison, threshold, what the targets say (docs/CONTRACT.md, section 9)
    ("ingest_vs_reference_c64", ">=", 1.0, "ingest at 64 clients >= the naive reference (median of 3 pairs)"),
    ("ingest_vs_one_statement_c64", ">=", 0.8, "as close as possible to the one-statement reference (goal: 0.8)"),
    ("relay_vs_peer", ">=", 0.8, "relay drain >= 0.8 x graphile-worker's no-op jobs (the queue's own limit)"),
    ("relay_vs_peer_http", ">=", 1.0, "relay drain >= graphile-worker doing the same POST per job"),
    ("relay_decay_ratio", ">=", 0.9, "three back-to-back drains within 10% of each other"),
    ("ingest_p99_ms_half_load", "<=", 20.0, "p99 ingest latency at half of peak <= 20 ms (the ingest's peak)"),
    ("ingest_p99_ms_half_load_with_relay", "<=", 20.0, "the same while a relay drains (half the end-to-end peak)"),
    ("ingest_p99_ms_during_prune", "<=", 20.0, "the same while the prune deletes (the ingest's peak)"),
    ("e2e_p50_ms_idle", "<=", 50.0, "webhook accepted -> downstream called, p50 idle <= 50 ms"),
    ("e2e_p99_ms_load", "<=", 100.0, "the same, p99 at half of the end-to-end peak <= 100 ms"),
    ("db_cpu_vs_naive", "<=", 0.5, "Postgres CPU per accepted webhook end to end <= 0.5x the naive design"),
    ("ingest_fresh_vs_steady", ">=", 0.9, "a new ingest's first 15 s on a new database >= 0.9x the steady state"),
    ("relay_drain_flatness_fresh", ">=", 0.8, "a new relay over the fresh backlog: first and last tenth within 20%"),
    ("relay_drain_flatness_outage", ">=", 0.8, "the same over 500k rows due after an outage, on six days of history"),
    ("ingest_rss_mib", "<=", 64.0, "ingest RSS under load <= 64 MiB"),
    ("relay_rss_mib", "<=", 64.0, "relay RSS under load <= 64 MiB"),
]
# The keys a complete report has: every target's, and these.
REQUIRED = [key for key, *_ in TARGETS] + [
    "ingest_rps_c1", "ingest_rps_c16", "ingest_rps_c64", "reference_tps_c64", "one_statement_tps_c64",
    "relay_rows_per_s_1", "relay_rows_per_s_2", "peer_jobs_per_s", "e2e_peak_rps", "ingest_rps_c64_10m_history",
    "db_cpu_us_per_webhook", "db_cpu_us_per_webhook_naive"]


def targets(r: dict) -> list[dict]:
    return [{"key": key, "value": r.get(key), "target": f"{op} {threshold:g}", "spec": what,
             "met": None if r.get(key) is None else (r[key] >= threshold if op == ">=" else r[key] <= threshold)}
            for key, op, threshold, what in TARGETS]


def fmt(v, digits: int = 0) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, (int, float)):
        if digits == 0 and abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:,.{max(digits, 1) if abs(v) < 100 else digits}f}"
    return str(v)


def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def ingest(r: dict) -> list[str]:
    """The ingest's title, table and the note on its median at 64 senders."""
    def v(key: str, digits: int = 0) -> str:
        return fmt(r.get(key), digits)

    rows = [[f"{c}", v(f"ingest_rps_c{c}"), f"{v(f'ingest_p50_ms_c{c}', 2)} / {v(f'ingest_p99_ms_c{c}', 2)}",
             v(f"reference_tps_c{c}"), f"{v(f'reference_p50_ms_c{c}', 2)} / {v(f'reference_p99_ms_c{c}', 2)}",
             v(f"one_statement_tps_c{c}"), v(f"ingest_vs_reference_c{c}", 2), v(f"ingest_vs_one_statement_c{c}", 2)]
            for c in CONCURRENCIES]
    out = [f"**Ingest** (closed loop, signed, 10% duplicates, "
           f"{r['config']['ingest_secs']:g} s each; pgbench `-M prepared` at the same concurrency)",
           table(["senders", "ours req/s", "ours p50/p99 ms", "naive tps", "naive p50/p99 ms", "one-stmt tps",
                  "vs naive", "vs one-stmt"], rows)]
    if r.get("ingest_vs_reference_c64_min") is not None:
        out.append(f"At 64 senders, vs naive is the median of three alternated pairs "
                   f"({v('ingest_vs_reference_c64_min', 2)} to {v('ingest_vs_reference_c64_max', 2)}).")
    return out


def figures(r: dict) -> list[tuple[str, str, str, str]]:
    """(name, figure, value, context): the figures beside the ingest's, as
    report.md and docs/BENCHMARK.md show them (the README some, by name)."""
    c = r["config"]
    labels = [hlabel(h) for h in r.get("growth_history_sizes") or []]

    def v(key: str, digits: int = 0) -> str:
        return fmt(r.get(key), digits)

    def each(key: str, digits: int = 0) -> str:
        return " / ".join(v(key.format(label), digits) for label in labels) or "n/a"

    return [
        ("half_load", "ingest p99 at half of peak (open loop)", f"{v('ingest_p99_ms_half_load', 2)} ms",
         f"at {v('half_load_rps')} req/s; p50 {v('ingest_p50_ms_half_load', 2)} ms"
         + "".join(f"; {n:,} answered {code}" for code, n in (r.get("half_load_status_counts") or {}).items()
                   if code != "200")),
        ("c64_with_relay", "ingest at 64 senders, a relay draining", f"{v('ingest_rps_c64_with_relay')} req/s",
         f"p99 {v('ingest_p99_ms_c64_with_relay', 2)} ms"),
        ("e2e_peak", "end-to-end peak (ingest and relay together)", f"{v('e2e_peak_rps')} webhooks/s",
         "answered and delivered"),
        ("half_e2e_peak", "ingest p99 at half of the end-to-end peak, relay draining",
         f"{v('ingest_p99_ms_half_load_with_relay', 2)} ms", f"at {v('e2e_load_rps')} req/s"),
        ("prune", f"ingest p99 at half of peak, prune deleting {v('prune_rows')} rows",
         f"{v('ingest_p99_ms_during_prune', 2)} ms", f"without the prune {v('ingest_p99_ms_baseline_prune', 2)} ms; "
         f"prune {v('prune_secs', 1)} s = {v('prune_rows_per_s')} rows/s at {v('prune_load_rps')} req/s"),
        ("e2e_idle", "e2e accepted -> downstream, idle", f"p50 {v('e2e_p50_ms_idle', 1)} / p99 "
         f"{v('e2e_p99_ms_idle', 1)} ms", f"{c['e2e_idle_events']} events at {E2E_RATE:g}/s"),
        ("e2e_load", "e2e accepted -> downstream, half of the end-to-end peak",
         f"p50 {v('e2e_p50_ms_load', 1)} / p99 {v('e2e_p99_ms_load', 1)} ms", f"at {v('e2e_load_rps')} req/s"),
        ("relay", "relay drain, one relay / two relays", f"{v('relay_rows_per_s_1')} / {v('relay_rows_per_s_2')} "
         "rows/s", f"{c['relay_rows']:,} rows, zero-latency downstream"),
        ("peer", "peer (graphile-worker, no-op jobs)", f"{v('peer_jobs_per_s')} jobs/s",
         f"relay/peer {v('relay_vs_peer', 2)} (ceiling {v('relay_vs_peer_ceiling', 2)} on these cores)"),
        ("peer_http", "peer, each job the same POST", f"{v('peer_http_jobs_per_s')} jobs/s",
         f"relay/peer {v('relay_vs_peer_http', 2)}"),
        ("decay", "three drains, no VACUUM between",
         f"{' / '.join(fmt(x) for x in r.get('relay_drain_rows_per_s') or []) or 'n/a'} rows/s",
         f"slowest/fastest {v('relay_decay_ratio', 2)}"),
        ("db_cpu", "Postgres CPU per webhook, end to end", f"{v('db_cpu_us_per_webhook', 1)} us",
         f"naive {v('db_cpu_us_per_webhook_naive', 1)}: {v('db_cpu_vs_naive', 2)} of the naive"),
        ("rss", "peak RSS ingest / relay", f"{v('ingest_rss_mib', 1)} / {v('relay_rss_mib', 1)} MiB", ""),
        ("growth", f"c64 with {' / '.join(label.upper() for label in labels) or 'n/a'} processed events, "
                   f"{hlabel(c['growth_outbox_done']).upper()} done rows", f"{each('ingest_rps_c64_{}_history')} req/s",
         f"p99 {each('ingest_p99_ms_c64_{}_history', 1)} ms; claim {each('claim_ms_{}_history', 2)} ms"),
        ("fresh", f"first {c['fresh_secs']:g} s on a just-migrated database / steady",
         f"{v('ingest_fresh_rps')} / {v('ingest_steady_rps')} req/s", f"fresh/steady {v('ingest_fresh_vs_steady', 2)}"),
        ("fresh_relay", "relay over the fresh ingest's backlog", f"{v('relay_fresh_rows_per_s')} rows/s",
         f"{v('relay_fresh_rows')} rows; first/last tenth {v('relay_drain_flatness_fresh', 2)}"),
        ("outage", f"relay over {v('relay_outage_rows')} due rows on six days of history",
         f"{v('relay_outage_rows_per_s')} rows/s",
         f"first/last tenth {v('relay_drain_flatness_outage', 2)}"),
    ]


def figures_table(r: dict, names: set[str] | None = None) -> str:
    return table(["figure", "value", "context"], [list(row[1:]) for row in figures(r) if not names or row[0] in names])


def run_line(r: dict) -> str:
    """The run and the machine, in one sentence."""
    m = r.get("machine") or {}
    s = m.get("postgres_settings") or {}
    settings = ", ".join(f"`{k}={s.get(k)}`" for k in ("fsync", "synchronous_commit", "full_page_writes",
                                                       "wal_sync_method", "shared_buffers"))
    return (f"One {r['mode']} run at commit {m.get('commit')} ({fmt(r.get('total_secs'))} s; "
            f"{(r.get('generated_at') or '')[:10]}): {m.get('cores')} vCPUs "
            f"({' '.join((m.get('cpu_model') or '').split()[:2])}), {(m.get('memory_mib') or 0) / 1024:.1f} GiB, "
            f"PostgreSQL {m.get('postgres_version')} ({settings}), load average "
            f"{fmt((m.get('load_average_at_start') or [None])[0], 1)} at the start and "
            f"{fmt((m.get('load_average_at_end') or [None])[0], 1)} at the end.")


def tables(r: dict) -> str:
    """report.md, which the run also prints: what a full run writes into
    docs/BENCHMARK.md, then the notes, what bounds the ratios, the phases."""
    parts = [latest(r), f"At half of the ingest's own peak, more than a relay can follow: e2e p99 "
             f"{fmt(r.get('e2e_p99_ms_half_ingest_peak'), 1)} ms, ingest p99 "
             f"{fmt(r.get('ingest_p99_ms_half_ingest_peak_with_relay'), 2)} ms at "
             f"{fmt(r.get('e2e_half_ingest_peak_rps'))} req/s.",
             "\n".join(f"- {r[k]}" for k in ("prune_note", "growth_note") if r.get(k))]
    if bounds(r):
        parts += ["**What bounds the ratios** (CPU by process, us per unit of work)",
                  table(["figure", "ours", "theirs", "measured / model / ceiling"], bounds(r))]
    phases = ", ".join(f"{k} {v:g}s" for k, v in r.get("phase_secs", {}).items())
    parts.append(f"Phases: {phases}; total {r.get('total_secs')} s. How each figure is measured: docs/BENCHMARK.md.")
    if r.get("errors"):
        parts.append("ERRORS: " + "; ".join(f"{k}: {v}" for k, v in r["errors"].items()))
    return "\n\n".join(p for p in parts if p) + "\n"


def bounds(r: dict) -> list[list[str]]:
    """Rows of the CPU split behind the ratios the targets miss or straddle:
    the ingest against the one-statement reference at 64 senders, one relay
    against the no-op peer."""
    d, rows = r.get("details", {}), []
    c64 = (d.get("ingest") or {}).get(64) or (d.get("ingest") or {}).get("64")
    if c64 and c64.get("bound"):
        rows.append(["ingest / one statement, 64 senders", brief(c64["ours"]["cpu_us_per_request"]),
                     brief(c64["one_statement"]["cpu_us_per_transaction"]),
                     f"{fmt(r.get('ingest_vs_one_statement_c64'), 2)} / {fmt(c64['bound']['model'], 2)} / "
                     f"{fmt(c64['bound']['ceiling'], 2)}"])
    if b := d.get("relay_bound"):
        rows.append(["relay / no-op peer, per row", brief(b["relay_us_per_row"]), brief(b["peer_us_per_job"]),
                     f"{fmt(r.get('relay_vs_peer'), 2)} / {fmt(b['model'], 2)} / {fmt(b['ceiling'], 2)}"])
    return rows


def write_report(bench: Bench) -> dict:
    r = bench.report
    r.update(targets=targets(r), phase_secs=bench.phases, total_secs=round(time.monotonic() - T0, 1),
             errors=bench.errors, missing_keys=[k for k in REQUIRED if r.get(k) is None], details=bench.details,
             generated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if "machine" in r:
        r["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "report.json").write_text(json.dumps(r, indent=2) + "\n")
    (OUT / "report.md").write_text(tables(r))
    return r


BENCHMARK = Path("docs") / "BENCHMARK.md"
README = Path("README.md")
# The README's rows of the latest run's figures (report.figures names).
SUMMARY = {"half_load", "prune", "e2e_peak", "half_e2e_peak", "e2e_idle", "e2e_load", "relay", "peer_http", "db_cpu",
           "rss", "growth", "fresh", "outage"}


def refusal(r: dict, phases: list) -> str | None:
    """Why this report may not rewrite the documents, or None."""
    if r.get("mode") != "full" or r.get("config", {}).get("bench_bin"):
        return f"a {r.get('mode')} run" + (" of BENCH_BIN's binaries" if r["config"].get("bench_bin") else "")
    missing = [p[0] for p in phases if p[0] not in r.get("phase_secs", {})]
    return (f"a partial run (without {', '.join(missing)})" if missing else
            f"a run with errors ({', '.join(r['errors'])})" if r.get("errors") else None)


def latest(r: dict) -> str:
    met = {m: ", ".join(f"`{t['key']}` ({fmt(t['value'], 2)})" for t in r["targets"] if t["met"] is m) or "none"
           for m in (True, False)}
    return "\n\n".join([run_line(r), *ingest(r), "**Latency, relay, memory, the states users meet**",
                        figures_table(r), f"**Targets** met: {met[True]}. Not met: {met[False]}."])


def summary(r: dict) -> str:
    return "\n\n".join([run_line(r), *ingest(r), figures_table(r, SUMMARY)])


def phase_table(phases: list) -> str:
    return table(["#", "phase", "what it measures"],
                 [[str(i), name, what] for i, (name, _, what) in enumerate(phases, 1)])


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with what stands between NAME's markers replaced by `body`."""
    begin, end = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"not exactly one pair of bench:{name} markers")
    return pattern.sub(lambda _: f"{begin}\n{body}\n{end}", text)


def write_documents(r: dict | None, phases: list, root: Path = ROOT, phase_table_anyway: bool = False
                    ) -> tuple[list[Path], str | None]:
    """Writes the generated parts from `r` if it is a full run; else nothing,
    or the phase table alone with `phase_table_anyway` (`--docs`). Returns
    the files changed and why the figures were not written."""
    why = "no report" if r is None else refusal(r, phases)
    if why and not phase_table_anyway:
        return [], why
    blocks = {BENCHMARK: {"phases": phase_table(phases)}, README: {}}
    if not why:
        blocks[BENCHMARK]["latest"] = latest(r)
        blocks[README]["summary"] = summary(r)
    changed = []
    for path, bodies in blocks.items():
        text = old = (root / path).read_text()
        for name, body in bodies.items():
            text = replace_block(text, name, body)
        if text != old:
            (root / path).write_text(text)
            changed.append(path)
    return changed, why
