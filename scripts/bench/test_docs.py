"""The documents' generated parts (report.py): `python3 -m unittest bench.test_docs`."""

from __future__ import annotations

import re
import tempfile
import unittest
from pathlib import Path

from . import report
from .common import ROOT
from .runner import PHASES

# A full run's report, as far as the tables read it (their text masks the figures).
SETTINGS = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
            "wal_sync_method": "fdatasync", "shared_buffers": "256MB"}
SAMPLE = {
    "mode": "full", "total_secs": 802.0, "generated_at": "2026-12-05T09:00:00Z", "errors": {},
    "phase_secs": {name: 1.0 for name, *_ in PHASES},
    "machine": {"commit": "3224d7f", "cores": 2, "cpu_model": "AMD EPYC", "memory_mib": 24064,
                "postgres_version": "15.20", "load_average_at_start": [2.0],
                "load_average_at_end": [3.0], "postgres_settings": SETTINGS},
    "config": {"ingest_secs": 15.0, "e2e_idle_events": 100, "relay_rows": 50_000,
               "growth_outbox_done": 1_000_000, "fresh_secs": 15.0},
    **{key: 1234.5 for key, *_ in report.TARGETS}, **{key: 8262 for key in report.REQUIRED},
    **{f"{k}_c{c}": 3.5 for c in (1, 16) for k in (
        "ingest_p50_ms", "ingest_p99_ms", "reference_tps", "reference_p50_ms",
        "reference_p99_ms", "ingest_vs_reference")},
    "ingest_vs_reference_c64_min": 1.85, "ingest_vs_reference_c64_max": 2.15,
    "prune_rows": 2_000_000, "relay_drain_rows_per_s": [20087, 20009, 18076],
    "growth_history_sizes": [1_000_000, 10_000_000], "ingest_rps_c64_1m_history": 8635,
    "claim_ms_1m_history": 0.33, "relay_outage_rows": 500_000,
}
SAMPLE["targets"] = report.targets(SAMPLE)


def block(text: str, name: str) -> str:
    begin, end = f"<!-- bench:{name}:begin -->\n", f"\n<!-- bench:{name}:end -->"
    return text.split(begin, 1)[1].split(end, 1)[0]


def skeleton(block: str) -> list:
    """What no run changes: the paragraphs with their figures masked, the run line and the
    targets line by their form, a table's first column."""
    def mask(text: str) -> str:
        return re.sub(r"N( / N)+", "N", re.sub(r"\d[\d,.]*[MK]?|n/a", "N", text))

    def part(p: str):
        if p.startswith("|"):
            return [(mask(row.split(" | ")[0]), row.count(" | ")) for row in p.splitlines()]
        if p.startswith("One full run at commit "):
            return "run line"
        listed = r"(none|`\w+` \(N\)(, `\w+` \(N\))*)"
        targets = rf"\*\*Targets\*\* met: {listed}\. Not met: {listed}\."
        return "targets" if re.fullmatch(targets, mask(p)) else mask(p)

    return [part(p) for p in block.split("\n\n")]


def copy(tmp: str) -> Path:
    """A root holding copies of the two documents."""
    for path in (report.BENCHMARK, report.README):
        (Path(tmp) / path).parent.mkdir(parents=True, exist_ok=True)
        (Path(tmp) / path).write_text((ROOT / path).read_text())
    return Path(tmp)


class Docs(unittest.TestCase):
    def test_the_documents_hold_what_a_full_run_writes(self):
        benchmark = (ROOT / report.BENCHMARK).read_text()
        self.assertEqual(block(benchmark, "phases"), report.phase_table(PHASES))
        self.assertEqual(skeleton(block(benchmark, "latest")), skeleton(report.latest(SAMPLE)))
        readme = (ROOT / report.README).read_text()
        self.assertEqual(skeleton(block(readme, "summary")), skeleton(report.summary(SAMPLE)))
        # What another full run may write has the same skeleton.
        other = {**SAMPLE, "growth_history_sizes": [500_000], "relay_vs_peer": None,
                 "half_load_status_counts": {"503": 4}, "relay_drain_flatness_outage": 0.9,
                 "machine": {**SAMPLE["machine"], "cpu_model": "Intel"}}
        other["targets"] = report.targets(other)
        self.assertEqual(skeleton(report.latest(other)), skeleton(report.latest(SAMPLE)))

    def test_a_full_run_replaces_the_figures_and_again_changes_nothing(self):
        other = {**SAMPLE, "ingest_rps_c64": 9999, "e2e_peak_rps": 7777}
        with tempfile.TemporaryDirectory() as tmp:
            root, both = copy(tmp), [report.BENCHMARK, report.README]
            self.assertEqual(report.write_documents(other, PHASES, root), (both, None))
            self.assertIn(report.latest(other), (root / report.BENCHMARK).read_text())
            self.assertIn("| 7,777 webhooks/s |", (root / report.README).read_text())
            self.assertEqual(report.write_documents(other, PHASES, root), ([], None))

    def test_only_a_full_run_of_every_phase_writes(self):
        self.assertIsNone(report.refusal(SAMPLE, PHASES))
        with tempfile.TemporaryDirectory() as tmp:
            root = copy(tmp)
            for change in ({"mode": "quick"}, {"phase_secs": {"setup": 1.0, "ingest": 1.0}},
                           {"errors": {"e2e": "x"}}):
                changed, why = report.write_documents({**SAMPLE, **change}, PHASES, root)
                self.assertEqual((changed, bool(why)), ([], True))
            for path in (report.BENCHMARK, report.README):
                self.assertEqual((root / path).read_text(), (ROOT / path).read_text())
