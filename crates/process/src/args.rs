//! The settings every service of ours takes the same way, as clap groups a
//! service flattens into its own `Settings` (`#[command(flatten)]`), so each
//! variable, its default and its `--help` text are written once:
//! - [`DatabaseArgs`], `DATABASE_URL` and `DATABASE_POOL_MODE`;
//! - [`AdminArgs`], `ADMIN_LISTEN_ADDR`;
//! - [`LogArgs`], `LOG_FORMAT`.
//!
//! Every argument is `global`, so it may follow a subcommand too
//! (`webhook-ingest migrate --database-url ...`).
//!
//! `DATABASE_POOL_SIZE` is not here on purpose: its default and bounds are
//! each service's decision (the ingest sizes for the database's cores, the
//! relay for short claims), so each `Settings` defines it with its reason.
//!
//! The database group turns its strings into a [`db::Database`], so the
//! errors about `DATABASE_URL` are written once too. That makes this crate
//! depend on `db` (which knows nothing of processes, so the arrow points one
//! way), rather than every service repeating the conversion.

use std::net::SocketAddr;

use crate::LogFormat;
use crate::secret::Secret;

/// Where Postgres is, and how it is reached.
#[derive(Debug, Clone, clap::Args)]
pub struct DatabaseArgs {
    /// postgres://user:password@host:port/db (sslmode=require / verify-full with sslrootcert work).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    pub database_url: Option<Secret<String>>,

    /// How DATABASE_URL reaches Postgres. Behind PgBouncer in transaction mode: `transaction`, with
    /// the session settings (statement_timeout, ...) on the login role (deploy/sql/roles.sql).
    #[arg(
        long,
        env = "DATABASE_POOL_MODE",
        value_enum,
        default_value = "session",
        global = true
    )]
    pub database_pool_mode: db::PoolMode,
}

impl DatabaseArgs {
    /// `DATABASE_URL` parsed, reached in `DATABASE_POOL_MODE`. Every command
    /// needs it; the error names the variable and never repeats the URL.
    pub fn parse_url(&self) -> Result<db::Database, String> {
        let url = self
            .database_url
            .as_ref()
            .ok_or("DATABASE_URL is required (postgres://user@host:port/db)")?;
        db::Database::parse(url.expose())
            .map(|database| database.with_pool_mode(self.database_pool_mode))
            .map_err(|e| format!("DATABASE_URL {e}"))
    }
}

/// The admin listener: see [`crate::admin`].
#[derive(Debug, Clone, clap::Args)]
pub struct AdminArgs {
    /// /healthz, /readyz and /metrics.
    #[arg(
        long,
        env = "ADMIN_LISTEN_ADDR",
        default_value = "0.0.0.0:9090",
        global = true
    )]
    pub admin_listen_addr: SocketAddr,
}

/// How log lines are written: see [`crate::logs`].
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "json", global = true)]
    pub log_format: LogFormat,
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Demo {
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        admin: AdminArgs,
        #[command(flatten)]
        log: LogArgs,
    }

    #[test]
    fn the_url_is_checked_and_never_shown() {
        let url = "postgres://app:hunter2@db.internal:5432/payments";
        let demo = Demo::try_parse_from(["demo", "--database-url", url]).unwrap();
        assert!(!format!("{demo:?}").contains("hunter2"), "{demo:?}");
        let database = demo.database.parse_url().unwrap();
        assert_eq!(database.describe(), "db.internal:5432/payments");
        assert_eq!(demo.admin.admin_listen_addr.port(), 9090);
        assert_eq!(demo.log.log_format, LogFormat::Json);

        // Built by hand: the tests' own DATABASE_URL would fill a parsed one.
        let missing = DatabaseArgs {
            database_url: None,
            database_pool_mode: db::PoolMode::Session,
        }
        .parse_url();
        assert!(missing.unwrap_err().starts_with("DATABASE_URL is required"));
        let bad = "postgres://app:hunter2@h/db?sslmode=often";
        let bad = Demo::try_parse_from(["demo", "--database-url", bad]).unwrap();
        let error = bad.database.parse_url().unwrap_err();
        assert!(
            error.starts_with("DATABASE_URL") && !error.contains("hunter2"),
            "{error}"
        );
    }
}
