"""Entry point: python -m deploy_smoke (see __init__.py; run it through
scripts/deploy-smoke.sh)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

try:
    from .breaks import BREAKS
    from .objects import SmokeFailure
    from .podman import Runtime
    from .neighbours import ROOT, Cluster, Downstream
    from .scenario import full
    from .smoke import INGEST, RELAY, Options, Smoke, Steps, say
except ImportError as e:  # pragma: no cover - environment problem
    sys.stderr.write(f"deploy-smoke: missing Python package ({e.name}); run scripts/deploy-smoke.sh\n")
    sys.exit(2)


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def run_break(b, opts: Options, cluster: Cluster, downstream: Downstream, timeout: float) -> str | None:
    """None if the smoke failed as it must; else what went wrong."""
    smoke = Smoke(Options(**{**opts.__dict__, "mutate": b.mutate, "ready_timeout": timeout, "quiet": True}), cluster, downstream)
    try:
        smoke.plan()
        smoke.database()
        smoke.migrate()
        for owner in (INGEST, RELAY):
            smoke.start_service(owner)
    except SmokeFailure as e:
        if b.expect not in str(e):
            return f"failed, but not for the expected reason ({b.expect!r}): {e}"
        say(f"the smoke FAILS, as it must: {e}")
        return None
    finally:
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

    images = json.loads(args.images.read_text())
    workdir = ROOT / "target/deploy-smoke"
    # Logs, audits and the report of the last run only.
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    key = hashlib.sha1(str(ROOT).encode()).hexdigest()[:10]
    opts = Options(args.overlay.resolve(), (args.secrets or args.overlay / "secrets.example.yaml").resolve(),
                   images, os.environ.get("DEPLOY_CHECK_KUBECTL", "kubectl"), key, workdir, args.ready_timeout)
    left = Runtime(key, workdir).remove_leftovers()
    if left:
        print(f"deploy-smoke: removed {left} container(s) an interrupted run left")

    t0 = time.monotonic()
    breaks = [b for b in BREAKS if b.name == args.only_break] if args.only_break else ([] if args.no_breaks else BREAKS)
    steps = Steps((0 if args.only_break else 9) + len(breaks))
    cluster = Cluster()
    downstream = Downstream(ROOT / images["bindir"] / "simulator", workdir)
    smoke = None
    try:
        if not args.only_break:
            smoke = Smoke(opts, cluster, downstream)
            try:
                full(smoke, steps)
            finally:
                smoke.cleanup()
        problems = []
        for b in breaks:
            with steps.step(f"self-test: a broken render ({b.name}) must fail the smoke"):
                problem = run_break(b, opts, cluster, downstream, min(args.ready_timeout, 15))
                if problem:
                    problems.append(f"{b.name}: {problem}")
                    say(f"NOT CAUGHT: {problem}")
        if problems:
            raise SmokeFailure("the smoke's self-test: " + "; ".join(problems))
    except SmokeFailure as e:
        print(f"deploy-smoke: FAILED: {e}", flush=True)
        print(f"deploy-smoke: logs in {workdir.relative_to(ROOT)}/", file=sys.stderr)
        return 1
    finally:
        downstream.stop()
        cluster.stop()

    elapsed = time.monotonic() - t0
    print(f"deploy-smoke: passed in {elapsed:.0f} s")
    report = {"profile": images["profile"], "revision": images["revision"], "seconds": round(elapsed, 1),
              "images": {k: {"tag": v["tag"], "bytes": v["size"]} for k, v in images["images"].items()},
              "base_bytes": images["base"]["size"]}
    if smoke:
        f = smoke.figures
        report.update(cold_start_secs={k: round(v, 3) for k, v in f.cold_start.items()},
                      kubelet_ready_secs={k: round(v, 1) for k, v in f.kubelet_ready.items()},
                      migrate_secs=round(f.migrate_secs, 2),
                      stop_secs={k: round(v.after_sigterm_secs, 2) for k, v in f.stops.items()})
        print(f"  images ({images['profile']} binaries; uncompressed):")
        for name, i in images["images"].items():
            print(f"    {i['tag']:<30} {mb(i['size']):>9}  (base stand-in {mb(images['base']['size'])})")
        print("  cold start to ready (podman run -> the first 200 from the readiness path, polled every 20 ms;"
              " in brackets, when the probe on the kubelet's schedule found it Ready):")
        for owner, secs in f.cold_start.items():
            print(f"    {owner:<28} {secs:.2f} s  (Ready at the kubelet's probe at {f.kubelet_ready[owner]:.1f} s)")
        print(f"  migration Job: {f.migrate_secs:.1f} s; SIGTERM to exit: "
              + ", ".join(f"{k.split('/')[1]} {v.after_sigterm_secs:.1f} s" for k, v in f.stops.items()))
    (workdir / "report.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
