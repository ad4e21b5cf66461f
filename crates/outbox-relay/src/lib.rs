//! outbox-relay: drains the outbox the ingest fills, calling the downstream
//! APIs with each row's idempotency key, exactly once in effect.
//!
//! # Layout
//! - [`config`]: environment variables and flags, checked together.
//! - [`startup`]: [`startup::Application`]: admin endpoints, listener, gauges,
//!   pruner and the loop, stopped by one token.
//! - [`worker`]: the claim -> send -> record loop, and [`worker::Relay::relay_once`].
//! - [`dispatch`]: one call and its classification; the retry policy.
//! - [`listener`]: `LISTEN outbox_pending`, re-established when it drops.
//! - [`storage`]: all SQL: claim, fenced completion, dead rows, stats, prune.
//! - [`metrics`]: the Prometheus metrics.
//! - [`ops`]: the operator's commands.
#![forbid(unsafe_code)]

pub mod config;
pub mod dispatch;
pub mod listener;
pub mod metrics;
pub mod ops;
pub mod startup;
pub mod storage;
pub mod worker;
