"""The report's plots: PNG images beside report.md, which links them.

    throughput.png  req/s against senders: ours, the naive and the one-statement references
    latency.png     latency percentiles of the ingest's runs, and accepted -> downstream effect
    drains.png      the relay's drains over time, and every drain's rows/s beside the peer's

The benchmark itself is standard library only: `draw` installs the pinned
packages of scripts/bench-requirements.txt (matplotlib) into a venv under
target/ once (again when that file changes), then runs this module there on
report.json. No plot is worth a benchmark: a failure (no venv, no PyPI, a
bug) is one line in the log, and the report is written without the plots
(BENCH_PLOTS=0 skips them). A plot whose phases did not run is left out.

Again for an existing report (the plots and report.md of target/bench):

    PYTHONPATH=scripts python3 -m bench.plots [target/bench/report.json]
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from .common import clean_env, run_cmd
from .config import OUT, ROOT, BenchError, log

VENV = Path(os.environ.get("BENCH_VENV") or ROOT / "target" / "bench-venv")
REQUIREMENTS = ROOT / "scripts" / "bench-requirements.txt"
# File, title: the order of report.md.
PLOTS = [
    ("throughput.png", "Throughput against senders"),
    ("latency.png", "Latency percentiles"),
    ("drains.png", "Relay drains"),
]


def draw(report_json: Path, out: Path) -> list[dict]:
    """The plots of `report_json` drawn into `out`: [{"file", "title"}] of
    those drawn, [] when none could be (said in the log)."""
    for name, _ in PLOTS:
        (out / name).unlink(missing_ok=True)  # never a plot of an earlier run
    if os.environ.get("BENCH_PLOTS", "") in ("0", "false", "no"):
        log("plots: skipped (BENCH_PLOTS=0)")
        return []
    try:
        python = venv_python()
        env = clean_env({"PYTHONPATH": str(ROOT / "scripts"), "MPLBACKEND": "Agg",
                         "MPLCONFIGDIR": str(VENV / "mplconfig")})
        rc, stdout, stderr = run_cmd("plots", [python, "-m", "bench.plots", "--draw", report_json, out],
                                     timeout=180, env=env, check=False)
    except BenchError as e:
        log(f"plots: not drawn: {e}; the report is complete without them")
        return []
    for line in stderr.strip().splitlines():
        log(f"plots: {line}")
    drawn = json.loads(stdout.strip().splitlines()[-1]) if rc == 0 and stdout.strip() else []
    if rc != 0:
        log(f"plots: not drawn (exit {rc}); the report is complete without them")
    elif drawn:
        log(f"plots: {', '.join(str(out / p['file']) for p in drawn)}")
    return drawn


def venv_python() -> Path:
    """The venv's python, with exactly the pinned packages."""
    want = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    stamp = VENV / ".requirements.sha256"
    python = VENV / "bin" / "python"
    if python.exists() and stamp.exists() and stamp.read_text().strip() == want:
        return python
    log(f"plots: installing {REQUIREMENTS.relative_to(ROOT)} into {VENV} (once, and when it changes)")
    shutil.rmtree(VENV, ignore_errors=True)
    rc, _, err = run_cmd("python3 -m venv", [sys.executable, "-m", "venv", VENV], timeout=120, check=False)
    if rc != 0:
        raise BenchError(f"'python3 -m venv' failed (on Debian: apt-get install python3-venv): {err.strip()[-300:]}")
    rc, _, err = run_cmd("pip install", [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                                         "--no-input", "-r", REQUIREMENTS], timeout=600, check=False)
    if rc != 0:
        lines = err.strip().splitlines()
        raise BenchError(f"pip could not install matplotlib (PyPI unreachable?): {lines[-1] if lines else rc}")
    stamp.write_text(want + "\n")
    return python


# What follows runs in the venv, with matplotlib.

PERCENTILES = [("p50", "p50_ms"), ("p90", "p90_ms"), ("p99", "p99_ms"), ("p99.9", "p999_ms"), ("max", "max_ms")]


def _thousands(axis) -> None:
    from matplotlib.ticker import StrMethodFormatter

    axis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))


def _throughput(plt, r: dict) -> object | None:
    senders = [1, 16, 64]
    series = [("ours (webhook-ingest)", "ingest_rps_c{}", "o-"),
              ("naive reference (pgbench)", "reference_tps_c{}", "s--"),
              ("one-statement reference (pgbench)", "one_statement_tps_c{}", "^--")]
    if all(r.get(key.format(c)) is None for _, key, _ in series for c in senders):
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, key, style in series:
        points = [(c, r.get(key.format(c))) for c in senders if r.get(key.format(c)) is not None]
        if points:
            ax.plot([c for c, _ in points], [v for _, v in points], style, label=label)
            for c, v in points:
                ax.annotate(f"{v:,.0f}", (c, v), textcoords="offset points", xytext=(6, 4), fontsize=8)
    if r.get("ingest_rps_c64_with_relay") is not None:
        ax.plot([64], [r["ingest_rps_c64_with_relay"]], "D", label="ours, a relay draining meanwhile")
    ax.set_xscale("log", base=2)
    ax.set_xticks(senders, [str(c) for c in senders])
    ax.set_xlabel("senders (closed loop; pgbench clients)")
    ax.set_ylabel("webhooks per second (req/s; tps)")
    ax.set_ylim(bottom=0)
    _thousands(ax.yaxis)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"Ingest throughput against senders ({r['config']['ingest_secs']:g} s each, 10% duplicates)")
    return fig


def _percentile_lines(ax, runs: list[tuple[str, dict | None, str]]) -> bool:
    drawn = False
    for label, run, style in runs:
        if not run:
            continue
        points = [(i, run.get(key)) for i, (_, key) in enumerate(PERCENTILES) if run.get(key) is not None]
        if len(points) >= 2:
            ax.plot([i for i, _ in points], [max(v, 0.01) for _, v in points], style, label=label)
            drawn = True
    ax.set_xticks(range(len(PERCENTILES)), [name for name, _ in PERCENTILES])
    ax.set_yscale("log")
    ax.set_ylabel("ms (log scale)")
    ax.grid(True, which="both", alpha=0.3)
    return drawn


def _latency(plt, r: dict) -> object | None:
    d = r.get("details", {})
    ingest = d.get("ingest") or {}

    def run(senders: int, who: str) -> dict | None:
        return (ingest.get(str(senders)) or {}).get(who)

    prune = d.get("prune") or {}
    e2e = d.get("e2e") or {}
    left = [(f"closed loop, {c} sender{'s' if c > 1 else ''}", run(c, "ours"), "o-") for c in (1, 16, 64)]
    left += [("naive reference, 64 clients", run(64, "reference"), "s:"),
             (f"open loop at {r.get('half_load_rps') or 0:,.0f} req/s (half of peak)", d.get("half_load"), "v-"),
             ("open loop, the prune's baseline window", prune.get("baseline"), "x--"),
             ("open loop, the prune deleting", prune.get("during"), "x-")]
    right = [("idle, 20 events/s", e2e.get("idle"), "o-"),
             (f"under load at {r.get('e2e_load_rps') or 0:,.0f} req/s", e2e.get("load"), "s-"),
             ("at half of the ingest's peak", (e2e.get("at_half_ingest_peak") or {}).get("load"), "^--")]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 7))
    drawn_a = _percentile_lines(a, left)
    a.axhline(20, color="red", linewidth=0.8, linestyle="--", label="target: p99 <= 20 ms at half of peak")
    a.set_title("Ingest: request answered (the provider's clock)")
    # Below the axes: the lines rise to the right and fill the corners.
    a.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=2)
    drawn_b = _percentile_lines(b, right)
    b.axhline(100, color="red", linewidth=0.8, linestyle="--", label="target: p99 <= 100 ms under load")
    b.axhline(50, color="orange", linewidth=0.8, linestyle=":", label="target: p50 <= 50 ms idle")
    b.set_title("End to end: accepted -> downstream effect")
    b.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=2)
    if not drawn_a and not drawn_b:
        plt.close(fig)
        return None
    fig.suptitle("Latency percentiles")
    return fig


def _drains(plt, r: dict) -> object | None:
    relay = (r.get("details", {}) or {}).get("relay") or {}
    curves = [(f"drain {i + 1}, one relay", d) for i, d in enumerate(relay.get("drains_one_relay") or [])]
    if relay.get("two_relays"):
        curves.append(("two relays", relay["two_relays"]))
    curves = [(label, d["effects_curve"]) for label, d in curves if d.get("effects_curve")]
    drains = r.get("relay_drain_rows_per_s") or []
    bars = [(f"drain {i + 1}", v) for i, v in enumerate(drains)]
    bars += [("two relays", r.get("relay_rows_per_s_2")),
             ("log line on", r.get("relay_rows_per_s_log_line_on")),
             ("log line off", r.get("relay_rows_per_s_log_line_off")),
             ("peer, no-op jobs", r.get("peer_jobs_per_s")),
             ("peer, a POST per job", r.get("peer_http_jobs_per_s"))]
    bars = [(label, v) for label, v in bars if v is not None]
    if not curves and not bars:
        return None
    fig, axes = plt.subplots(1, 2 if curves and bars else 1, figsize=(13 if curves and bars else 7, 5))
    axes = list(axes) if curves and bars else [axes]
    if curves:
        ax = axes.pop(0)
        for label, curve in curves:
            ax.plot([t for t, _ in curve], [n for _, n in curve], label=label)
        ax.set_xlabel("seconds since the rows' COMMIT")
        ax.set_ylabel("effects at the downstream")
        ax.set_ylim(bottom=0)
        _thousands(ax.yaxis)
        ax.set_xlim(left=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        ax.set_title(f"Drains of {r['config']['relay_rows']:,} rows (zero-latency downstream)")
    if bars:
        ax = axes.pop(0)
        colors = ["tab:green" if label.startswith("peer") else "tab:blue" for label, _ in bars]
        ax.barh([label for label, _ in bars], [v for _, v in bars], color=colors)
        for i, (_, v) in enumerate(bars):
            ax.annotate(f" {v:,.0f}", (v, i), va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("rows (peer: jobs) per second")
        _thousands(ax.xaxis)
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_title("The relay's drains beside the peer (graphile-worker)")
    fig.tight_layout()
    return fig


def _draw_all(report_json: Path, out: Path) -> list[dict]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = json.loads(report_json.read_text())
    figures = {"throughput.png": _throughput, "latency.png": _latency, "drains.png": _drains}
    drawn = []
    for name, title in PLOTS:
        try:
            fig = figures[name](plt, r)
            if fig is None:
                continue
            fig.savefig(out / name, dpi=110, bbox_inches="tight")
            plt.close(fig)
            drawn.append({"file": name, "title": title})
        except Exception as e:  # noqa: BLE001 - one plot's bug leaves the others
            print(f"{name} not drawn: {type(e).__name__}: {e}", file=sys.stderr)
    return drawn


def main(argv: list[str]) -> int:
    if argv[:1] == ["--draw"]:
        print(json.dumps(_draw_all(Path(argv[1]), Path(argv[2]))))
        return 0
    report_json = Path(argv[0]) if argv else OUT / "report.json"
    from .report import tables

    r = json.loads(report_json.read_text())
    r["plots"] = draw(report_json, report_json.parent)
    report_json.write_text(json.dumps(r, indent=2) + "\n")
    (report_json.parent / "report.md").write_text(tables(r))
    print(f"report: {report_json.parent / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
