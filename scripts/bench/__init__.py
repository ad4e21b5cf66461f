"""`make bench`: the benchmark report of docs/BENCHMARK.md, measured in ONE run on ONE
Postgres server (DATABASE_URL, an admin URL allowed to CREATE DATABASE).

    make bench                  # full: about 15 minutes
    BENCH_QUICK=1 make bench    # quick: about 5 minutes, smaller sizes, same keys

What it does, in order (each phase is announced as it starts, `[4/14] relay
...`, and ends with its wall time, which the report keeps):

 1. setup     databases bench_product (migrated, 1M orders, some history),
              bench_ref (bench/schema.sql), bench_peer (empty); the
              downstream simulator; the peer's node_modules (once).
 2. ingest    closed loop at 1, 16 and 64 senders (signed, 10% duplicates),
              each beside pgbench running both reference files at the same
              concurrency and duration; every run starts from the same state.
 3. half load open loop at half of the measured peak: p99.
 4. relay     50,000 rows inserted at once (one statement + NOTIFY) while the
              relay is running and idle; three back-to-back drains with one
              relay (no manual VACUUM between them), then one with two relays
              (after a VACUUM, so it starts where the first did).
 5. peer      graphile-worker draining as many no-op jobs (bench_peer).
 6. e2e       webhook accepted -> downstream effect, idle (events one by one)
              and while a provider load runs at half of peak.
 6b. db_cpu   Postgres CPU (every server process, /proc) per webhook: the ingest at
              half of peak with a relay delivering, then pgbench at the same rate
              on the naive and the one-statement designs (ingest and relay
              scripts 25:1), each until nothing is pending; two rounds, the
              second in the reverse order.
 7. tracing   a short 64-sender run with and without OTLP export (to a local sink).
 7b. relay_log the relay's log line per call (docs/CONTRACT.md, section 8): drains with it on
              (the default level) and off (RUST_LOG=warn), alternated on, off,
              off, on; the ratio of the rates is its cost.
 8. prune     retention under load: 1M done outbox rows and 1M processed events
              30 days old (quick: 50k and 50k); the ingest at half of peak (open
              loop) for a baseline window, then while `outbox-relay prune`
              deletes them: p50/p99 of both, the prune's time and rows/s.
 9. growth    64 senders and the relay's claim with 1M / 10M processed events
              and 1M done outbox rows (quick: 100k / 500k and 100k); a history
              the time budget cannot generate is cut, and the report says so.
 10. backlog  the relay's backlog gauge statement with 3M pending rows
              (quick: 300k): its median time.
 11. fresh    a just-migrated database (bench_fresh): a new ingest at 64
              senders for its first 15 s, then the same on that database with
              the usual history (fresh / steady); a new relay over the backlog
              of the first run's payments (first tenth of the rows against the
              last).
 12. outage   500,000 rows due at once after a downstream outage, on six days
              of processed events and done outbox rows (1M each; quick: 100k
              each): a new relay drains them (first tenth against the last);
              graphile-worker over as many no-op jobs (full runs).

While working on one phase: BENCH_PHASES=prune (a comma-separated list; setup
always runs) and BENCH_PEAK_RPS=<req/s> in place of the ingest phase's peak.
Such a run's report is partial and says which phases ran.

Writes target/bench/report.json, target/bench/report.md, the plots it links
(PNG, beside it), logs under target/bench/logs/. Standard library only, but
for the plots: matplotlib, pinned in scripts/bench-requirements.txt and
installed into target/bench-venv on first use (a failure there costs the
plots, not the report; see plots.py). Every process it starts is stopped
on exit, on Ctrl-C and on SIGTERM; every wait is bounded. Webhooks are signed
and sent by the simulator (`simulator provider`), never here.

Run as `python3 -m bench` with scripts/ on the path (make bench does).

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
  report      targets, tables, report.json and report.md
  plots       the PNG plots report.md links (run in the venv)
"""
