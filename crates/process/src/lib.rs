//! What every process of ours does the same way.
//!
//! # Layout
//! - [`config`]: configuration errors as one line naming the variable, exit 2.
//! - [`shutdown`]: a cancellation token fed by SIGTERM and Ctrl-C.
//! - [`logs`]: JSON lines (default) or pretty output, filtered by `RUST_LOG`.
//! - [`traces`]: OpenTelemetry spans, exported over OTLP when configured; W3C
//!   trace context helpers.
//! - [`admin`]: the admin listener: `/healthz`, `/readyz`, `/metrics`.
#![forbid(unsafe_code)]

pub mod admin;
pub mod config;
pub mod logs;
pub mod shutdown;
pub mod traces;

pub use admin::{AdminServer, Readiness};
pub use config::{config_error, parse_or_exit};
pub use logs::LogFormat;
