//! webhook-ingest against a real Postgres (a fresh database per test) over
//! real HTTP on loopback.

mod cancel;
mod config;
mod dedup;
mod helpers;
mod hostile;
mod outage;
mod outcomes;
mod roles;
mod shutdown;
mod signatures;
