//! outbox-relay against a real Postgres (a fresh database per test), the
//! simulated downstream over real HTTP, and real processes where a test kills
//! or stops one.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers beside the tests: a panic is how a test fails"
)]

mod call_log;
mod crash;
mod credentials;
mod dead;
mod delivery;
mod fencing;
mod helpers;
mod network;
mod notify;
mod ops;
mod oversized;
mod plans;
mod refunds;
mod retries;
mod roles;
