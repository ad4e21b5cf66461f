"""`python3 -m bench` (make bench): see the package's docstring.
`--list` prints the phases; `--docs` writes the documents' generated parts
again (report.py) from target/bench/report.json."""

from __future__ import annotations

import json
import os
import signal
import sys

from .common import PROCS
from .config import CFG, LOGS, OUT, BenchError, log
from .db import Db
from .report import tables, write_documents, write_report
from .runner import PHASES, Bench


def main(argv: list[str]) -> int:
    if argv == ["--list"]:
        print("\n".join(f"{i:2}. {name:10} {what}" for i, (name, _, what) in enumerate(PHASES, 1)))
        return 0
    if argv == ["--docs"]:
        report = OUT / "report.json"
        return write_docs(json.loads(report.read_text()) if report.exists() else None, phase_table_anyway=True)
    if argv:
        print("usage: python3 -m bench [--list | --docs]  (see docs/BENCHMARK.md)", file=sys.stderr)
        return 2
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
    print(tables(r))
    print(f"report: {OUT / 'report.json'} and {OUT / 'report.md'}")
    if r.get("plots"):
        print(f"plots: {', '.join(str(OUT / p['file']) for p in r['plots'])}")
    if r["missing_keys"]:
        print(f"missing: {', '.join(r['missing_keys'])}")
    write_docs(r)
    return 130 if interrupted else (1 if bench.errors else 0)


def write_docs(r: dict | None, phase_table_anyway: bool = False) -> int:
    changed, why = write_documents(r, PHASES, phase_table_anyway=phase_table_anyway)
    print(f"documents: {', '.join(map(str, changed)) or 'unchanged'}" + (f" (no figures: {why})" if why else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
