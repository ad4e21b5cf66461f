//! Simulated neighbours of the product, for tests, `make run` and `make bench`.
//!
//! - The downstream fulfilment and email APIs the relay calls, with
//!   Stripe-like idempotency keys, injected faults and stats that count
//!   effects, so a test can assert "exactly one shipment per order".
//! - The payment provider that signs and delivers webhooks at least once
//!   (retries, duplicates, concurrent bursts), which doubles as the load
//!   generator.
//! - A fault-injecting TCP proxy to put between the relay and the
//!   downstream: delays, cut connections, black holes, refusals.
//!
//! Tests start a downstream in process with [`downstream::spawn`]; scripts run
//! `simulator downstream`, which prints `{"listening":"ADDR"}` and serves the
//! same thing. Tests and benches run the provider in process with
//! [`provider::run`]; scripts run `simulator provider`. Tests put a proxy in
//! process with [`proxy::spawn`]; scripts run `simulator proxy`, which prints
//! `{"listening":"ADDR","control":"ADDR"}`.
//!
//! After a run, `simulator audit` ([`audit::run`]) checks the product's
//! promise, the downstream's records against the database: in totals (every
//! command in the outbox had exactly one effect) and per order.
//!
//! # Layout
//! - [`audit`]: exactly once in totals and the per-order rules, checked after a run.
//! - [`cli`]: the command line (`simulator downstream|provider|proxy|send|audit ...`).
//! - [`downstream`]: the server, its idempotency and faults, `/stats`.
//! - [`provider`]: events, signed deliveries and retries, the load loops, the summary.
//! - [`proxy`]: the TCP proxy, its faults and control endpoints, its stats.
#![forbid(unsafe_code)]

pub mod audit;
pub mod cli;
pub mod downstream;
pub mod provider;
pub mod proxy;
