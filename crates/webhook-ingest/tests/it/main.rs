//! webhook-ingest against a real Postgres (a fresh database per test) over
//! real HTTP on loopback.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers beside the tests: a panic is how a test fails"
)]

mod cancel;
mod config;
mod dedup;
mod helpers;
mod hostile;
mod locked;
mod metrics;
mod openapi;
mod outage;
mod outcomes;
mod plans;
mod roles;
mod shutdown;
mod signatures;
mod slow_bodies;
mod story;
mod terminal;
mod unmatched;
mod warm;
