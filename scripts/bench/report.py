"""The report: the targets and whether each is met, the tables printed at the end and written
to report.md, report.json with every key; and the documents' generated parts, between
`<!-- bench:NAME:begin -->` and `<!-- bench:NAME:end -->`: docs/BENCHMARK.md's `phases`
(runner.PHASES) and `latest` run, and the README's quote of it, `summary`. Only a full run of
every phase without errors writes those (`python3 -m bench --docs` again)."""

from __future__ import annotations

import json
import os
import re
import string
import time
from pathlib import Path

from .common import CONCURRENCIES, E2E_RATE, OUT, ROOT, T0, hlabel
from .db_cpu import brief

TARGETS = [  # key, comparison, threshold, what SPEC.md section 8 says
    ("ingest_vs_reference_c64", ">=", 1.0, "ingest at 64 clients >= the naive reference"),
    ("ingest_vs_one_statement_c64", ">=", 0.8, "close to the one-statement reference (goal)"),
    ("relay_vs_peer", ">=", 0.8, "relay drain >= 0.8x graphile-worker's no-op jobs"),
    ("relay_vs_peer_http", ">=", 1.0, "relay drain >= graphile-worker doing the same POST"),
    ("relay_decay_ratio", ">=", 0.9, "three back-to-back drains within 10% of each other"),
    ("ingest_p99_ms_half_load", "<=", 20.0, "ingest p99 at half of the ingest's peak"),
    ("ingest_p99_ms_half_load_with_relay", "<=", 20.0, "the same, half the e2e peak, relay"),
    ("ingest_p99_ms_during_prune", "<=", 20.0, "the same while the prune deletes"),
    ("e2e_p50_ms_idle", "<=", 50.0, "webhook accepted -> downstream called, p50 idle"),
    ("e2e_p99_ms_load", "<=", 100.0, "the same, p99 at half of the end-to-end peak"),
    ("db_cpu_vs_naive", "<=", 0.5, "Postgres CPU per webhook end to end, vs the naive design"),
    ("ingest_fresh_vs_steady", ">=", 0.9, "first 15 s on a just-migrated database vs steady"),
    ("relay_drain_flatness_fresh", ">=", 0.8, "a new relay over the fresh backlog, flat"),
    ("relay_drain_flatness_outage", ">=", 0.8, "the same over the rows an outage left due"),
    ("ingest_rss_mib", "<=", 64.0, "ingest RSS under load"),
    ("relay_rss_mib", "<=", 64.0, "relay RSS under load"),
]
# The keys a complete report has: every target's, and these.
REQUIRED = [key for key, *_ in TARGETS] + [
    "ingest_rps_c1", "ingest_rps_c16", "ingest_rps_c64", "reference_tps_c64",
    "one_statement_tps_c64", "relay_rows_per_s_1", "relay_rows_per_s_2", "peer_jobs_per_s",
    "e2e_peak_rps", "ingest_rps_c64_10m_history", "db_cpu_us_per_webhook",
    "db_cpu_us_per_webhook_naive"]


def targets(r: dict) -> list[dict]:
    def met(v, op: str, threshold: float) -> bool | None:
        return None if v is None else v >= threshold if op == ">=" else v <= threshold

    return [{"key": key, "value": r.get(key), "target": f"{op} {threshold:g}", "spec": what,
             "met": met(r.get(key), op, threshold)} for key, op, threshold, what in TARGETS]


def fmt(v, digits: int = 0) -> str:
    if v is None:
        return "n/a"
    if not isinstance(v, (int, float)):
        return str(v)
    if digits == 0 and abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:,.{max(digits, 1) if abs(v) < 100 else digits}f}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def ingest(r: dict) -> list[str]:
    """The ingest's title, table and the note on its median at 64 senders."""
    def v(key: str, digits: int = 0) -> str:
        return fmt(r.get(key), digits)

    def p50_99(name: str, c: int) -> str:
        return f"{v(f'{name}_p50_ms_c{c}', 2)} / {v(f'{name}_p99_ms_c{c}', 2)}"

    rows = [[f"{c}", v(f"ingest_rps_c{c}"), p50_99("ingest", c), v(f"reference_tps_c{c}"),
             p50_99("reference", c), v(f"one_statement_tps_c{c}"),
             v(f"ingest_vs_reference_c{c}", 2), v(f"ingest_vs_one_statement_c{c}", 2)]
            for c in CONCURRENCIES]
    out = [f"**Ingest** (closed loop, signed, 10% duplicates, {r['config']['ingest_secs']:g} s "
           "each; pgbench `-M prepared` at the same concurrency)",
           table(["senders", "ours req/s", "ours p50/p99 ms", "naive tps", "naive p50/p99 ms",
                  "one-stmt tps", "vs naive", "vs one-stmt"], rows)]
    if r.get("ingest_vs_reference_c64_min") is not None:
        out.append("At 64 senders, vs naive is the median of three alternated pairs "
                   f"({v('ingest_vs_reference_c64_min', 2)} to "
                   f"{v('ingest_vs_reference_c64_max', 2)}).")
    return out


# The figures beside the ingest's, as report.md and docs/BENCHMARK.md show them (the README
# some, by name): name, figure, value, context; "{key:2}" is fmt(the key's value, 2).
FIGURES = [
    ("half_load", "ingest p99 at half of peak (open loop)", "{ingest_p99_ms_half_load:2} ms",
     "at {half_load_rps} req/s; p50 {ingest_p50_ms_half_load:2} ms{refused}"),
    ("c64_with_relay", "ingest at 64 senders, a relay draining",
     "{ingest_rps_c64_with_relay} req/s", "p99 {ingest_p99_ms_c64_with_relay:2} ms"),
    ("e2e_peak", "end-to-end peak (ingest and relay together)", "{e2e_peak_rps} webhooks/s",
     "answered and delivered"),
    ("half_e2e_peak", "ingest p99 at half of the end-to-end peak, relay draining",
     "{ingest_p99_ms_half_load_with_relay:2} ms", "at {e2e_load_rps} req/s"),
    ("prune", "ingest p99 at half of peak, prune deleting {prune_rows} rows",
     "{ingest_p99_ms_during_prune:2} ms", "without the prune {ingest_p99_ms_baseline_prune:2} "
     "ms; prune {prune_secs:1} s = {prune_rows_per_s} rows/s at {prune_load_rps} req/s"),
    ("e2e_idle", "e2e accepted -> downstream, idle",
     "p50 {e2e_p50_ms_idle:1} / p99 {e2e_p99_ms_idle:1} ms", "{idle_events} events at {rate}/s"),
    ("e2e_load", "e2e accepted -> downstream, half of the end-to-end peak",
     "p50 {e2e_p50_ms_load:1} / p99 {e2e_p99_ms_load:1} ms", "at {e2e_load_rps} req/s"),
    ("relay", "relay drain, one relay / two relays",
     "{relay_rows_per_s_1} / {relay_rows_per_s_2} rows/s",
     "{relay_rows} rows, zero-latency downstream"),
    ("peer", "peer (graphile-worker, no-op jobs)", "{peer_jobs_per_s} jobs/s",
     "relay/peer {relay_vs_peer:2} (ceiling {relay_vs_peer_ceiling:2} on these cores)"),
    ("peer_http", "peer, each job the same POST", "{peer_http_jobs_per_s} jobs/s",
     "relay/peer {relay_vs_peer_http:2}"),
    ("decay", "three drains, no VACUUM between", "{drains} rows/s",
     "slowest/fastest {relay_decay_ratio:2}"),
    ("db_cpu", "Postgres CPU per webhook, end to end", "{db_cpu_us_per_webhook:1} us",
     "naive {db_cpu_us_per_webhook_naive:1}: {db_cpu_vs_naive:2} of the naive"),
    ("rss", "peak RSS ingest / relay", "{ingest_rss_mib:1} / {relay_rss_mib:1} MiB", ""),
    ("growth", "c64 with {histories} processed events, {done_rows} done rows",
     "{growth_rps} req/s", "p99 {growth_p99} ms; claim {growth_claim} ms"),
    ("fresh", "first {fresh_secs} s on a just-migrated database / steady",
     "{ingest_fresh_rps} / {ingest_steady_rps} req/s", "fresh/steady {ingest_fresh_vs_steady:2}"),
    ("fresh_relay", "relay over the fresh ingest's backlog", "{relay_fresh_rows_per_s} rows/s",
     "{relay_fresh_rows} rows; first/last tenth {relay_drain_flatness_fresh:2}"),
    ("outage", "relay over {relay_outage_rows} due rows on six days of history",
     "{relay_outage_rows_per_s} rows/s", "first/last tenth {relay_drain_flatness_outage:2}"),
]


class Figures(string.Formatter):
    """FIGURES' templates filled from a report, and the few values they show composed."""

    def __init__(self, r: dict) -> None:
        c, labels = r["config"], [hlabel(h) for h in r.get("growth_history_sizes") or []]

        def joined(values) -> str:
            return " / ".join(values) or "n/a"

        def each(key: str, digits: int) -> str:
            return joined(fmt(r.get(key.format(x)), digits) for x in labels)

        counts = (r.get("half_load_status_counts") or {}).items()
        self.values = {
            **r, "idle_events": str(c["e2e_idle_events"]), "rate": f"{E2E_RATE:g}",
            "relay_rows": f"{c['relay_rows']:,}", "fresh_secs": f"{c['fresh_secs']:g}",
            "refused": "".join(f"; {n:,} answered {code}" for code, n in counts if code != "200"),
            "drains": joined(map(fmt, r.get("relay_drain_rows_per_s") or [])),
            "histories": joined(x.upper() for x in labels),
            "done_rows": hlabel(c["growth_outbox_done"]).upper(),
            "growth_rps": each("ingest_rps_c64_{}_history", 0),
            "growth_p99": each("ingest_p99_ms_c64_{}_history", 1),
            "growth_claim": each("claim_ms_{}_history", 2),
        }

    def get_value(self, key, args, kwargs):
        return self.values.get(key)

    def format_field(self, value, spec: str) -> str:
        return value if isinstance(value, str) else fmt(value, int(spec or 0))

    def rows(self, names: set[str] | None = None) -> list[list[str]]:
        return [[self.format(x) for x in row[1:]] for row in FIGURES
                if not names or row[0] in names]


def run_line(r: dict) -> str:
    """The run and the machine, in one sentence."""
    m = r.get("machine") or {}
    s = m.get("postgres_settings") or {}
    settings = ", ".join(f"`{k}={s.get(k)}`" for k in (
        "fsync", "synchronous_commit", "full_page_writes", "wal_sync_method", "shared_buffers"))
    load = [fmt((m.get(f"load_average_at_{at}") or [None])[0], 1) for at in ("start", "end")]
    return (f"One {r['mode']} run at commit {m.get('commit')} ({fmt(r.get('total_secs'))} s; "
            f"{(r.get('generated_at') or '')[:10]}): {m.get('cores')} vCPUs "
            f"({' '.join((m.get('cpu_model') or '').split()[:2])}), "
            f"{(m.get('memory_mib') or 0) / 1024:.1f} GiB, PostgreSQL "
            f"{m.get('postgres_version')} ({settings}), load average {load[0]} at the start and "
            f"{load[1]} at the end.")


def tables(r: dict) -> str:
    """report.md, which the run also prints: what a full run writes into docs/BENCHMARK.md,
    then the run at half of the ingest's peak, what bounds the ratios, the phases."""
    parts = [latest(r), Figures(r).format(
        "At half of the ingest's own peak, more than a relay can follow: e2e p99 "
        "{e2e_p99_ms_half_ingest_peak:1} ms, ingest p99 "
        "{ingest_p99_ms_half_ingest_peak_with_relay:2} ms at {e2e_half_ingest_peak_rps} req/s.")]
    if bounds(r):
        parts += ["**What bounds the ratios** (CPU by process, us per unit of work)",
                  table(["figure", "ours", "theirs", "measured / model / ceiling"], bounds(r))]
    phases = ", ".join(f"{k} {v:g}s" for k, v in r.get("phase_secs", {}).items())
    parts.append(f"Phases: {phases}; total {r.get('total_secs')} s. "
                 "How each figure is measured: docs/BENCHMARK.md.")
    if r.get("errors"):
        parts.append("ERRORS: " + "; ".join(f"{k}: {v}" for k, v in r["errors"].items()))
    return "\n\n".join(p for p in parts if p) + "\n"


def bounds(r: dict) -> list[list[str]]:
    """The CPU split behind the ratios the targets miss or straddle: the ingest against the
    one-statement reference at 64 senders, one relay against the no-op peer."""
    d, rows = r.get("details", {}), []
    c64 = (d.get("ingest") or {}).get(64) or (d.get("ingest") or {}).get("64")
    if c64 and (b := c64.get("bound")):
        rows.append(["ingest / one statement, 64 senders", brief(c64["ours"]["cpu_us_per_request"]),
                     brief(c64["one_statement"]["cpu_us_per_transaction"]),
                     f"{fmt(r.get('ingest_vs_one_statement_c64'), 2)} / {fmt(b['model'], 2)} / "
                     f"{fmt(b['ceiling'], 2)}"])
    if b := d.get("relay_bound"):
        rows.append(["relay / no-op peer, per row", brief(b["relay_us_per_row"]),
                     brief(b["peer_us_per_job"]), f"{fmt(r.get('relay_vs_peer'), 2)} / "
                     f"{fmt(b['model'], 2)} / {fmt(b['ceiling'], 2)}"])
    return rows


def write_report(bench) -> dict:
    r = bench.report
    r.update(targets=targets(r), phase_secs=bench.phases, errors=bench.errors,
             total_secs=round(time.monotonic() - T0, 1), details=bench.details,
             missing_keys=[k for k in REQUIRED if r.get(k) is None],
             generated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if "machine" in r:
        r["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "report.json").write_text(json.dumps(r, indent=2) + "\n")
    (OUT / "report.md").write_text(tables(r))
    return r


BENCHMARK, README = Path("docs") / "BENCHMARK.md", Path("README.md")
# The README's rows of the latest run's figures (report.figures names).
SUMMARY = {"half_load", "prune", "e2e_peak", "half_e2e_peak", "e2e_idle", "e2e_load", "relay",
           "peer_http", "db_cpu", "rss", "growth", "fresh", "outage"}


def refusal(r: dict, phases: list) -> str | None:
    """Why this report may not rewrite the documents, or None."""
    if r.get("mode") != "full":
        return f"a {r.get('mode')} run"
    if missing := [p[0] for p in phases if p[0] not in r.get("phase_secs", {})]:
        return f"a partial run (without {', '.join(missing)})"
    return f"a run with errors ({', '.join(r['errors'])})" if r.get("errors") else None


def latest(r: dict) -> str:
    met = {m: ", ".join(f"`{t['key']}` ({fmt(t['value'], 2)})" for t in r["targets"]
                        if t["met"] is m) or "none" for m in (True, False)}
    rows = Figures(r).rows()
    title = "**Latency, relay, memory, the states users meet**"
    return "\n\n".join([run_line(r), *ingest(r), title, table(["figure", "value", "context"], rows),
                        f"**Targets** met: {met[True]}. Not met: {met[False]}."])


def summary(r: dict) -> str:
    rows = Figures(r).rows(SUMMARY)
    return "\n\n".join([run_line(r), *ingest(r), table(["figure", "value", "context"], rows)])


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


def write_documents(r: dict | None, phases: list, root: Path = ROOT,
                    phase_table_anyway: bool = False) -> tuple[list[Path], str | None]:
    """Writes the generated parts from `r` if it is a full run; else nothing, or the phase
    table alone with `phase_table_anyway` (`--docs`). The files changed, and why the figures
    were not written."""
    why = "no report" if r is None else refusal(r, phases)
    if why and not phase_table_anyway:
        return [], why
    blocks = {BENCHMARK: {"phases": phase_table(phases)}, README: {}}
    if not why:
        blocks[BENCHMARK]["latest"], blocks[README]["summary"] = latest(r), summary(r)
    changed = []
    for path, bodies in blocks.items():
        text = old = (root / path).read_text()
        for name, body in bodies.items():
            text = replace_block(text, name, body)
        if text != old:
            (root / path).write_text(text)
            changed.append(path)
    return changed, why
