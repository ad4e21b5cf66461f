//! outbox-relay: drains the outbox the ingest fills, calling the downstream
//! APIs with each row's idempotency key, exactly once in effect.
//!
//! A row's fate has two names: what its call produced
//! ([`dispatch::CallResult`]), and what is recorded for the row
//! ([`storage::Verdict`]); [`policy::RetryPolicy`] turns one into the other.
//!
//! # Layout
//! - [`config`]: environment variables and flags, checked together.
//! - [`startup`]: [`startup::Application`]: admin endpoints, listener, gauges,
//!   pruner and the loop, stopped by one token.
//! - [`worker`]: the claim -> send -> record loop, and [`worker::Relay::relay_once`].
//! - [`dispatch`]: one call and its [`dispatch::CallResult`].
//! - [`downstream`]: one downstream API from its variables: its URL and credential.
//! - [`policy`]: the retry policy: a call result to a verdict, with backoff.
//! - [`listener`]: `LISTEN` on [`db::NOTIFY_CHANNEL`], re-established when it drops.
//! - [`storage`]: all SQL, one file per step: claim, fenced completion, gauges,
//!   dead rows, prune, audit.
//! - [`metrics`]: the Prometheus metrics.
//! - [`ops`]: the operator's commands.
#![forbid(unsafe_code)]

pub mod config;
pub mod dispatch;
pub mod downstream;
pub mod listener;
pub mod metrics;
pub mod ops;
pub mod policy;
pub mod startup;
pub mod storage;
pub mod worker;
