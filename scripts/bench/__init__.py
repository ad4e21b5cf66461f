"""`make bench`: the benchmark of docs/BENCHMARK.md, measured in ONE run on ONE
Postgres server (DATABASE_URL, an admin URL allowed to CREATE DATABASE).

    make bench                  # full, every phase: rewrites the documents' figures
    BENCH_QUICK=1 make bench    # quick: smaller sizes, the same keys; target/bench only

The phases, in order, are runner.PHASES (`python3 -m bench --list`), one
module each (runner.py also has setup, ingest.py half_load, relay.py peer,
fresh.py outage); BENCH_PHASES=prune runs setup and the phases named (a
partial report), BENCH_PEAK_RPS=<req/s> stands in for the ingest phase's
peak. It writes target/bench/report.json, report.md and logs under
target/bench/logs/; a full run of every phase without errors also rewrites
the generated parts of docs/BENCHMARK.md and README.md (report.py). Standard
library only. Every process it starts is stopped on exit, on Ctrl-C and on
SIGTERM; every wait is bounded. Webhooks are signed and sent by `simulator
provider`, never here. The shared modules: config (modes, sizes, constants),
common (processes, HTTP, meters), db (psql, the databases, generated
history), services (the processes under test, the load, the state the
phases share), db_cpu (CPU by process)."""
