//! Postgres plumbing shared by both services.
//!
//! # Layout
//! - [`connect`]: [`Database`], a parsed `DATABASE_URL`, and single
//!   connections with a service's [`ConnectOptions`]; every one of them with
//!   `search_path` pinned to [`SEARCH_PATH`] (`pg_catalog`), which is why the
//!   product's statements name their tables `public.<table>`.
//! - `url`: reading `DATABASE_URL`, libpq's `sslmode` values included
//!   (`verify-ca` / `verify-full` with `sslrootcert`).
//! - `tls`: the rustls verifiers behind those `sslmode` values.
//! - [`pool`]: the services' pools, direct or behind a transaction-mode pooler
//!   (`DATABASE_POOL_MODE`).
//! - `cancel`: [`Canceller`], which cancels a statement on the server.
//! - [`sql`]: [`Sql`], a statement with its parameter types and result
//!   columns, the one place that decides how it is sent (named and prepared
//!   once per connection, or unnamed), and [`sql::check`], which holds a
//!   statement against a migrated schema.
//! - [`migrate`]: the migrations in `migrations/`, embedded in the binary, applied
//!   under an advisory lock, refused ([`UnsafeSchema`]) while others may create
//!   in schema `public`; the schema status.
//! - [`ready`]: the database half of `/readyz` (reachable, `search_path`
//!   pinned, schema current).
//! - `error`: [`is_connectivity_error`], what a database error means;
//!   [`error_chain`], an error with its causes; [`setting_to_check`], where
//!   a failed connection points.
//! - [`span`]: the statements' client spans ([`client_span!`]), by the
//!   OpenTelemetry conventions for database spans.
//!
//! This crate's own statements are `.sql` files beside their modules
//! (`src/migrate/`, `src/ready/`), listed in [`STATEMENTS`].
#![forbid(unsafe_code)]

mod cancel;
pub mod connect;
mod error;
pub mod migrate;
mod mode;
pub mod pool;
pub mod ready;
pub mod span;
pub mod sql;
mod tls;
mod url;

pub use cancel::Canceller;
pub use connect::{ConnectOptions, Database, INDEX_PATHS, SEARCH_PATH};
pub use error::{advice, error_chain, is_connectivity_error, setting_to_check};
pub use migrate::{SchemaStatus, UnsafeSchema, migrate, schema_status};
pub use mode::PoolMode;
pub use pool::{Client, Pool, PoolError, PoolStatus};
pub use sql::{Column, Executor, Sql, col};
pub use url::DatabaseUrlError;

/// For [`client_span!`]: the `tracing` its expansion names.
#[doc(hidden)]
pub use tracing as __tracing;

/// The channel the ingest notifies after a commit that enqueued commands, and
/// the relay `LISTEN`s on. Statements take it as a parameter.
pub const NOTIFY_CHANNEL: &str = "outbox_pending";

/// Every statement this crate runs, for the test that prepares each one
/// against the migrated schema.
pub const STATEMENTS: &[&Sql] = &[
    &migrate::LOCK,
    &migrate::UNLOCK,
    &migrate::HISTORY_EXISTS,
    &migrate::APPLIED_VERSION,
    &migrate::REWORD_CHECKSUM,
    &migrate::SET_SEARCH_PATH,
    &migrate::PUBLIC_SCHEMA_CREATORS,
    &ready::ROLE_SETTINGS,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_declares_a_type_for_each_placeholder() {
        for sql in STATEMENTS {
            assert_eq!(sql.placeholders(), sql.types.len(), "{}", sql.name);
        }
    }
}
