//! webhook-ingest: receives a payment provider's webhooks and, for each event,
//! verifies it, claims its id, changes the order and enqueues the outbox
//! commands, in one database transaction.
//!
//! # Layout
//! - [`config`]: environment variables and flags.
//! - [`startup`]: [`startup::Application`]: listeners, pool, run until stopped.
//! - [`http`]: the webhook handler: read, verify, shed, record, answer.
//! - [`record`]: a verified delivery into the database: batched, retried
//!   behind a locked order, cancelled at the deadline.
//! - [`storage`]: all SQL; the one-statement claim-and-apply.
//! - [`error`]: every failure and the status the provider gets.
//! - [`metrics`]: the Prometheus metrics.
//! - [`notifier`]: wakes the relays after commits, coalescing `NOTIFY`s.
//! - [`reconcile`]: payments that arrived before their orders, applied by
//!   themselves once the order exists.
//! - [`events`]: `webhook-ingest events list|show|replay|discard`, for operators.
//! - [`settle`]: replaying or discarding an `unmatched` event, for the CLI
//!   and the operator's console: what happened, for each to say.
#![forbid(unsafe_code)]

pub mod config;
pub mod error;
pub mod events;
pub mod http;
pub mod metrics;
pub mod notifier;
pub mod reconcile;
pub mod record;
pub mod settle;
pub mod startup;
pub mod storage;
