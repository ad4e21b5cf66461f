"""Entry point: python -m deploy_smoke (see __init__.py; run it through
scripts/deploy-smoke.sh)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

try:
    from .breaks import BREAKS, Break
    from .manifests import ROOT, SmokeFailure
    from .neighbours import Cluster, Downstream
    from .pods import remove_leftovers
    from .scenario import INGEST, RELAY, Options, Smoke, Steps, full, say
except ImportError as e:  # pragma: no cover - environment problem
    sys.stderr.write(f"deploy-smoke: missing Python package ({e.name}); run scripts/deploy-smoke.sh\n")
    sys.exit(2)


def run_break(b: Break, opts: Options, cluster: Cluster, downstream: Downstream) -> str | None:
    """None if the smoke failed as it must; else what went wrong."""
    smoke = None
    try:
        smoke = Smoke(opts, cluster, downstream, b.mutate)
        smoke.create_secrets()
        smoke.database()
        smoke.migrate()
        for name in (INGEST, RELAY):
            smoke.start(name, opts.ready_timeout)
    except SmokeFailure as e:
        if b.expect not in str(e):
            return f"failed, but not for the expected reason ({b.expect!r}): {e}"
        say(f"the smoke FAILS, as it must: {e}")
        return None
    finally:
        if smoke:
            smoke.cleanup()
    return "the smoke passed a broken render"


def main() -> int:
    parser = argparse.ArgumentParser(prog="deploy-smoke", description=__doc__.split("\n\n")[0])
    parser.add_argument("--overlay", type=Path, default=ROOT / "deploy/overlays/dev")
    parser.add_argument("--secrets", type=Path, help="the example Secrets (default: the overlay's secrets.example.yaml)")
    parser.add_argument("--images", type=Path, default=ROOT / "target/images/images.json")
    parser.add_argument("--ready-timeout", type=float, default=float(os.environ.get("DEPLOY_SMOKE_READY_SECS", 60)),
                        help="how long a pod may take to become Ready (default 60 s)")
    parser.add_argument("--break", dest="only_break", choices=[b.name for b in BREAKS],
                        help="only this broken render, expecting the smoke to fail")
    parser.add_argument("--no-breaks", action="store_true", help="skip the broken renders")
    args = parser.parse_args()
    # SIGTERM (a CI job's timeout) unwinds like Ctrl-C: every pod is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    images = json.loads(args.images.read_text())
    workdir = ROOT / "target/deploy-smoke"
    # Logs, the played YAML, audits and the report of the last run only.
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    key = hashlib.sha1(str(ROOT).encode()).hexdigest()[:10]
    opts = Options(args.overlay.resolve(), (args.secrets or args.overlay / "secrets.example.yaml").resolve(),
                   images, os.environ.get("DEPLOY_CHECK_KUBECTL", "kubectl"), key, workdir, args.ready_timeout)
    left = remove_leftovers(key)
    if left:
        print(f"deploy-smoke: removed {left} pod(s) an interrupted run left")

    t0 = time.monotonic()
    breaks = [b for b in BREAKS if b.name == args.only_break] if args.only_break else ([] if args.no_breaks else BREAKS)
    steps = Steps((0 if args.only_break else 7) + len(breaks))
    cluster = Cluster()
    downstream = Downstream(ROOT / images["bindir"] / "simulator", workdir)
    smoke = None
    try:
        if not args.only_break:
            try:
                smoke = Smoke(opts, cluster, downstream)
                full(smoke, steps)
            finally:
                if smoke:
                    smoke.cleanup()
        # A broken pod need not take the whole ready timeout to be refused.
        opts.ready_timeout = min(args.ready_timeout, 15)
        problems = []
        for b in breaks:
            with steps.step(f"self-test: a broken render ({b.name}) must fail the smoke"):
                problem = run_break(b, opts, cluster, downstream)
                if problem:
                    problems.append(f"{b.name}: {problem}")
                    say(f"NOT CAUGHT: {problem}")
        if problems:
            raise SmokeFailure("the smoke's self-test: " + "; ".join(problems))
    except SmokeFailure as e:
        print(f"deploy-smoke: FAILED: {e}", flush=True)
        print(f"deploy-smoke: logs and the played YAML in {workdir.relative_to(ROOT)}/", file=sys.stderr)
        return 1
    finally:
        downstream.stop()
        cluster.stop()

    elapsed = time.monotonic() - t0
    print(f"deploy-smoke: passed in {elapsed:.0f} s")
    report = {"profile": images["profile"], "revision": images["revision"], "seconds": round(elapsed, 1),
              "images": {k: {"tag": v["tag"], "bytes": v["size"]} for k, v in images["images"].items()}}
    if smoke:
        report.update({k: round(v, 2) for k, v in smoke.figures.items()})
    (workdir / "report.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
