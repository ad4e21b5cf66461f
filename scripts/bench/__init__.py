"""`make bench`: the benchmark of docs/BENCHMARK.md, in ONE run on ONE Postgres server
(DATABASE_URL, an admin URL allowed to CREATE DATABASE). Standard library only; every process
it starts is stopped on exit, Ctrl-C and SIGTERM; every wait is bounded; webhooks are signed
and sent by `simulator provider`, never here.

Layout: runner (PHASES, the setup phase, main), one module per phase or two (ingest:
ingest and half_load; relay: relay and peer; e2e; db_cpu, with the CPU split by process;
history: prune and growth; fresh: fresh and outage), report (the targets, the tables, the
documents' generated parts) and what they share: common (modes, sizes, constants,
processes, HTTP), db (psql, the databases, generated history), services (the processes under
test, the load, the state the phases share)."""
