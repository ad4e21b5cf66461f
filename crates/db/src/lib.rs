//! Postgres plumbing shared by both services.
//!
//! # Layout
//! - [`connect`]: `DATABASE_URL` parsing (libpq's `sslmode` values, including
//!   `verify-ca` / `verify-full` with `sslrootcert`), TLS with rustls, single
//!   connections and pools.
//! - [`pool`]: the services' pools, direct or behind a transaction-mode pooler
//!   (`DATABASE_POOL_MODE`).
//! - [`sql`]: every statement of both services, and the one place that decides
//!   how it is sent (named and prepared once per connection, or unnamed).
//! - [`migrate`]: the migrations in `migrations/`, embedded in the binary, applied
//!   under an advisory lock; the schema status.
//! - [`ready`]: the database half of `/readyz`.
#![forbid(unsafe_code)]

pub mod connect;
pub mod migrate;
pub mod pool;
pub mod ready;
pub mod sql;

pub use connect::{ConnectOptions, Database, DatabaseUrlError};
pub use migrate::{SchemaStatus, migrate, schema_status};
pub use pool::{Client, Pool, PoolError, PoolMode};
pub use sql::{Column, Executor, Sql, col};

/// The channel the ingest notifies after a commit that enqueued commands, and
/// the relay `LISTEN`s on. Statements take it as a parameter.
pub const NOTIFY_CHANNEL: &str = "outbox_pending";

/// `SQLSTATE` of a unique violation, for callers that branch on it.
pub const UNIQUE_VIOLATION: &str = "23505";

/// True when an error means the database could not be reached or the
/// connection broke, as opposed to a problem with the statement itself.
pub fn is_connectivity_error(err: &tokio_postgres::Error) -> bool {
    if err.is_closed() {
        return true;
    }
    match err.code() {
        // admin_shutdown, crash_shutdown, cannot_connect_now, connection_failure...
        Some(code) => {
            let c = code.code();
            c.starts_with("08") || c.starts_with("57P") || c == "53300"
        }
        None => true,
    }
}
