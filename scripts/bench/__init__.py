"""`make bench`: the benchmark of docs/BENCHMARK.md, measured in ONE run on ONE
Postgres server (DATABASE_URL, an admin URL allowed to CREATE DATABASE).

    make bench                  # full, every phase: rewrites the documents' figures
    BENCH_QUICK=1 make bench    # quick: smaller sizes, the same keys; target/bench only

The phases, in order, are runner.PHASES (`python3 -m bench --list`); each is
announced as it starts (`[n/of] name ...`) and ends with its wall time.
BENCH_PHASES=prune runs setup and the phases named (a partial report);
BENCH_PEAK_RPS=<req/s> stands in for the ingest phase's peak.

Writes target/bench/report.json, report.md, the plots it links and logs under
target/bench/logs/; a full run of every phase without errors also rewrites
the generated parts of docs/BENCHMARK.md and README.md (report.py). Standard
library only, but for the plots (matplotlib in a venv: plots.py). Every
process it starts is stopped on exit, on Ctrl-C and on SIGTERM; every wait is
bounded. Webhooks are signed and sent by `simulator provider`, never here.

Layout:
  config      modes, sizes, constants, the log line
  common      processes, HTTP, CPU and memory meters, percentiles
  db          Postgres through psql: the databases, one-shot SQL, sessions
  history     generated history (processed events, done outbox rows)
  services    the downstream, the ingest and the relay as processes
  load        `simulator provider` runs and their summaries
  runner      the phases in order, their errors and wall times
  prepare, ingest, relay, peer, e2e, db_cpu, tracing, relay_log, prune, growth,
  backlog, fresh, outage
              one module per phase (ingest also has the half-load phase)
  cpu_split   the CPU by process behind the ratios
  report      targets, tables, report.json, report.md and the documents' parts
  plots       the PNG plots report.md links (run in the venv)
"""
