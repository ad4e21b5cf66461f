"""`python3 -m bench` (make bench): see the package's docstring."""

from __future__ import annotations

import os
import signal
import sys

from .common import PROCS
from .config import CFG, LOGS, OUT, BenchError, log
from .db import Db
from .report import tables, write_report
from .runner import Bench


def main() -> int:
    url = os.environ.get("DATABASE_URL")
    if not url:
        print("bench: DATABASE_URL is not set: run `make bench` (it starts a throwaway Postgres)", file=sys.stderr)
        return 2
    LOGS.mkdir(parents=True, exist_ok=True)

    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    db = Db(url)
    bench = Bench(db)
    log(f"make bench ({CFG['mode']}): logs in {LOGS}")
    interrupted = False
    try:
        bench.run()
    except KeyboardInterrupt:
        interrupted = True
        bench.errors["interrupted"] = "stopped by a signal before the end"
        log("interrupted: stopping everything this run started")
    except BenchError as e:
        bench.errors["fatal"] = str(e)
        log(f"FAILED: {e}")
    finally:
        try:
            bench.record_rss() if not bench.rss.get("ingest") else None
        except Exception:  # noqa: BLE001
            pass
        PROCS.stop_all()
        if not interrupted:
            bench.drop_databases()
    r = write_report(bench)
    print()
    print(tables(r, md=False))
    print(f"report: {OUT / 'report.json'} and {OUT / 'report.md'}")
    if r.get("plots"):
        print(f"plots: {', '.join(str(OUT / p['file']) for p in r['plots'])}")
    if r["missing_keys"]:
        print(f"missing: {', '.join(r['missing_keys'])}")
    return 130 if interrupted else (1 if bench.errors else 0)


if __name__ == "__main__":
    sys.exit(main())
