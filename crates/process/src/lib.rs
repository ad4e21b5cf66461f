//! What every process of ours does the same way: how it takes its settings,
//! how it starts and ends, how it is observed, how it stops, and how it holds
//! its secrets. `webhook-ingest` and `outbox-relay` differ only in their work;
//! the simulator's commands use the parts that fit them.
//!
//! # Layout
//! - [`args`]: the clap groups every service flattens into its `Settings`:
//!   database, admin listener, log format.
//! - [`config`]: configuration errors as one line naming the variable.
//! - [`run`]: the start-up: telemetry, then the runtime, then the exit code.
//! - [`runtime`]: the tokio runtime, one worker per CPU of the cgroup's quota.
//! - [`exit`]: the exit codes (0, 1 failure, 2 configuration), in one place.
//! - [`secret`]: [`Secret`], a value that prints `[redacted]`.
//! - [`terminal`]: [`terminal::printable`], database text made safe for a
//!   terminal (control and bidi characters escaped) in the operator tables.
//! - [`shutdown`]: a cancellation token fed by SIGTERM and Ctrl-C.
//! - [`logs`]: JSON lines (default) or pretty output, filtered by `RUST_LOG`.
//! - [`traces`]: OpenTelemetry spans, exported over OTLP when configured; W3C
//!   trace context helpers.
//! - [`admin`]: the admin listener: `/healthz`, `/readyz`, `/metrics`.
//! - [`metrics`]: what every service exports besides its own metrics: its
//!   build, the process (`process_*`) and its connection pool (`db_pool_*`).
#![forbid(unsafe_code)]

pub mod admin;
pub mod args;
pub mod config;
pub mod exit;
pub mod logs;
pub mod metrics;
pub mod run;
pub mod runtime;
pub mod secret;
pub mod shutdown;
pub mod terminal;
pub mod traces;

pub use admin::{AdminServer, Readiness};
pub use args::{AdminArgs, DatabaseArgs, LogArgs};
pub use config::{config_error, parse_or_exit};
pub use logs::LogFormat;
pub use run::{run_command, run_service};
pub use secret::Secret;
