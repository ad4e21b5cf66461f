"""The documents' generated parts (report.py):
PYTHONPATH=scripts python3 -m unittest bench.test_docs"""

from __future__ import annotations

import re
import tempfile
import unittest
from pathlib import Path

from . import report
from .config import ROOT
from .runner import PHASES

# The full run at 3224d7f, as docs/BENCHMARK.md gave its figures (the keys the tables read).
SAMPLE = {
    "mode": "full", "total_secs": 802.0, "generated_at": "2026-12-05T09:00:00Z", "errors": {},
    "phase_secs": {name: 1.0 for name, *_ in PHASES},
    "machine": {"commit": "3224d7f", "cores": 2, "cpu_model": "AMD EPYC", "memory_mib": 24064,
                "postgres_version": "15.20", "load_average_at_start": [2.0], "load_average_at_end": [3.0],
                "postgres_settings": {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
                                      "wal_sync_method": "fdatasync", "shared_buffers": "256MB"}},
    "config": {"ingest_secs": 15.0, "e2e_idle_events": 100, "relay_rows": 50_000, "growth_outbox_done": 1_000_000,
               "fresh_secs": 15.0},
    **{f"{k}_c{c}": v for k, vs in {
        "ingest_rps": (1088, 6273, 8262), "ingest_p50_ms": (0.88, 2.70, 8.30), "ingest_p99_ms": (4.04, 6.32, 16.07),
        "reference_tps": (590, 4572, 3841), "reference_p50_ms": (1.60, 3.18, 14.98),
        "reference_p99_ms": (3.67, 8.89, 35.13), "one_statement_tps": (3107, 9522, 7107),
        "ingest_vs_reference": (1.84, 1.37, 1.98), "ingest_vs_one_statement": (0.35, 0.66, 1.16),
    }.items() for c, v in zip((1, 16, 64), vs)},
    "ingest_vs_reference_c64_min": 1.85, "ingest_vs_reference_c64_max": 2.15,
    "ingest_p99_ms_half_load": 9.24, "half_load_rps": 4104, "ingest_p50_ms_half_load": 2.87,
    "ingest_rps_c64_with_relay": 5544, "ingest_p99_ms_c64_with_relay": 30.77, "e2e_peak_rps": 5227,
    "ingest_p99_ms_half_load_with_relay": 6.92, "e2e_load_rps": 2595, "prune_rows": 2_000_000,
    "ingest_p99_ms_during_prune": 54.91, "ingest_p99_ms_baseline_prune": 10.29, "prune_secs": 101.2,
    "prune_rows_per_s": 19761, "prune_load_rps": 4146, "e2e_p50_ms_idle": 1.0, "e2e_p99_ms_idle": 48.0,
    "e2e_p50_ms_load": 4.0, "e2e_p99_ms_load": 8.0, "relay_rows_per_s_1": 20087, "relay_rows_per_s_2": 19792,
    "peer_jobs_per_s": 29439, "relay_vs_peer": 0.68, "relay_vs_peer_ceiling": 0.74, "peer_http_jobs_per_s": 3022,
    "relay_vs_peer_http": 6.65, "relay_drain_rows_per_s": [20087, 20009, 18076], "relay_decay_ratio": 0.90,
    "db_cpu_us_per_webhook": 205.2, "db_cpu_us_per_webhook_naive": 938.7, "db_cpu_us_per_webhook_limit": 856.0,
    "db_cpu_vs_naive": 0.22, "ingest_rss_mib": 38.5, "relay_rss_mib": 29.2, "tracing_overhead_pct": 10.5,
    "growth_history_sizes": [1_000_000, 10_000_000], "ingest_rps_c64_1m_history": 8635,
    "ingest_rps_c64_10m_history": 7652, "ingest_p99_ms_c64_1m_history": 17.0, "ingest_p99_ms_c64_10m_history": 17.7,
    "claim_ms_1m_history": 0.33, "claim_ms_10m_history": 0.35, "ingest_fresh_rps": 8934, "ingest_steady_rps": 9172,
    "ingest_fresh_vs_steady": 0.97, "relay_fresh_rows_per_s": 19726, "relay_fresh_rows": 244_860,
    "relay_drain_flatness_fresh": 0.94, "relay_outage_rows": 500_000, "relay_outage_rows_per_s": 14220,
    "relay_drain_flatness_outage": 0.71, "peer_outage_jobs_per_s": 36957,
}
SAMPLE["targets"] = report.targets(SAMPLE)


def block(text: str, name: str) -> str:
    return re.search(rf"<!-- bench:{name}:begin -->\n(.*?)\n<!-- bench:{name}:end -->", text, re.S).group(1)


def skeleton(block: str) -> list:
    """What no run changes: the paragraphs with their figures masked, the run
    line and the targets line by their form, a table's first column."""
    def mask(text: str) -> str:
        return re.sub(r"N( / N)+", "N", re.sub(r"\d[\d,.]*[MK]?|n/a", "N", text))

    def part(p: str):
        if p.startswith("|"):
            return [(mask(row.split(" | ")[0]), row.count(" | ")) for row in p.splitlines()]
        if p.startswith("One full run at commit "):
            return "run line"
        listed = r"(none|`\w+` \(N\)(, `\w+` \(N\))*)"
        return "targets" if re.fullmatch(rf"\*\*Targets\*\* met: {listed}\. Not met: {listed}\.", mask(p)) else mask(p)
    return [part(p) for p in block.split("\n\n")]


def copy(tmp: str) -> Path:
    """A root holding copies of the two documents."""
    for path in (report.BENCHMARK, report.README):
        (Path(tmp) / path).parent.mkdir(parents=True, exist_ok=True)
        (Path(tmp) / path).write_text((ROOT / path).read_text())
    return Path(tmp)


class Docs(unittest.TestCase):
    def test_the_documents_hold_what_a_full_run_writes(self):
        benchmark, readme = (ROOT / report.BENCHMARK).read_text(), (ROOT / report.README).read_text()
        self.assertEqual(block(benchmark, "phases"), report.phase_table(PHASES))
        self.assertEqual(skeleton(block(benchmark, "latest")), skeleton(report.latest(SAMPLE)))
        self.assertEqual(skeleton(block(readme, "summary")), skeleton(report.summary(SAMPLE)))
        # What another full run may write has the same skeleton.
        other = {**SAMPLE, "growth_history_sizes": [500_000], "machine": {**SAMPLE["machine"], "cpu_model": "Intel"},
                 "half_load_status_counts": {"503": 4}, "relay_vs_peer": None, "relay_drain_flatness_outage": 0.9}
        other["targets"] = report.targets(other)
        self.assertEqual(skeleton(report.latest(other)), skeleton(report.latest(SAMPLE)))

    def test_a_full_run_replaces_the_figures_and_again_changes_nothing(self):
        other = {**SAMPLE, "ingest_rps_c64": 9999, "e2e_peak_rps": 7777}
        with tempfile.TemporaryDirectory() as tmp:
            root = copy(tmp)
            self.assertEqual(report.write_documents(other, PHASES, root), ([report.BENCHMARK, report.README], None))
            self.assertIn(report.latest(other), (root / report.BENCHMARK).read_text())
            self.assertIn("| 7,777 webhooks/s |", (root / report.README).read_text())
            self.assertEqual(report.write_documents(other, PHASES, root), ([], None))

    def test_only_a_full_run_of_every_phase_writes(self):
        self.assertIsNone(report.refusal(SAMPLE, PHASES))
        with tempfile.TemporaryDirectory() as tmp:
            root = copy(tmp)
            for change in ({"mode": "quick"}, {"phase_secs": {"setup": 1.0, "ingest": 1.0}}, {"errors": {"e2e": "x"}},
                           {"config": {**SAMPLE["config"], "bench_bin": "/elsewhere"}}):
                changed, why = report.write_documents({**SAMPLE, **change, "total_secs": 1.0}, PHASES, root)
                self.assertEqual((changed, bool(why)), ([], True))
            for path in (report.BENCHMARK, report.README):
                self.assertEqual((root / path).read_text(), (ROOT / path).read_text())
