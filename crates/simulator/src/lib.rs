//! Simulated neighbours of the product, for tests, `make run` and `make bench`.
//!
//! Today: the downstream fulfilment and email APIs the relay calls, with
//! Stripe-like idempotency keys, injected faults and stats that count
//! effects, so a test can assert "exactly one shipment per order". Later: the
//! payment provider that sends webhooks.
//!
//! Tests start a downstream in process with [`downstream::spawn`]; scripts run
//! `simulator downstream`, which prints `{"listening":"ADDR"}` and serves the
//! same thing.
//!
//! # Layout
//! - [`cli`]: the command line (`simulator downstream ...`).
//! - [`downstream`]: the server, its idempotency and faults, `/stats`.
#![forbid(unsafe_code)]

pub mod cli;
pub mod downstream;
