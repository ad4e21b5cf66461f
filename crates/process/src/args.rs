//! The settings every service of ours takes the same way, as clap groups a
//! service flattens into its own `Settings` (`#[command(flatten)]`), so each
//! variable, its default and its `--help` text are written once:
//! - [`DatabaseArgs`], `DATABASE_URL` and `DATABASE_POOL_MODE`;
//! - [`AdminArgs`], `ADMIN_LISTEN_ADDR`;
//! - [`LogArgs`], `LOG_FORMAT`.
//!
//! The database and log arguments are `global`: every command takes them,
//! and they may follow a subcommand (`webhook-ingest migrate --database-url
//! ...`). The admin listener, like every other setting of a service alone,
//! is not: a subcommand's `--help` shows its own flags and these few.
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
use std::time::Duration;

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

/// The ingest's admin port by default ([`AdminArgs`]).
pub const INGEST_ADMIN_PORT: u16 = 9090;
/// The relay's: another, so that both run side by side on one machine.
pub const RELAY_ADMIN_PORT: u16 = 9091;
/// The operator's console's: a third, beside both.
pub const CONSOLE_ADMIN_PORT: u16 = 9092;

/// The admin listener, on port `PORT` of every interface by default: see
/// [`crate::admin`].
#[derive(Debug, Clone, clap::Args)]
pub struct AdminArgs<const PORT: u16> {
    /// /healthz, /readyz and /metrics.
    #[arg(
        long,
        env = "ADMIN_LISTEN_ADDR",
        default_value_t = SocketAddr::from(([0, 0, 0, 0], PORT))
    )]
    pub admin_listen_addr: SocketAddr,
}

/// How log lines are written: see [`crate::logs`].
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "json", global = true)]
    pub log_format: LogFormat,
}

/// The longest duration [`parse_duration`] accepts: 100 years, beyond any
/// retention, and far from where seconds overflow (u64, Postgres intervals).
pub const MAX_DURATION_SECS: u64 = 36_500 * 86_400;

/// `90s`, `30m`, `6h`, `7d` (a unit always), at most
/// [`MAX_DURATION_SECS`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let expected = || format!("`{text}`: expected a number and a unit (s, m, h, d), such as 90s or 6h");
    // A bare number is refused rather than read as seconds: `--since 5`
    // meant five of something, and a guess of the unit is a wrong window.
    if text == "0" {
        return Ok(Duration::ZERO); // zero of any unit
    }
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map(|i| text.split_at(i))
        .ok_or_else(expected)?;
    let n: u64 = number.parse().map_err(|_| expected())?;
    let per_unit: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("`{text}`: unknown unit `{unit}` (s, m, h, d)")),
    };
    // Checked, never wrapped: a window that overflows is an error, not a
    // short window that looks valid.
    match n.checked_mul(per_unit) {
        Some(secs) if secs <= MAX_DURATION_SECS => Ok(Duration::from_secs(secs)),
        _ => Err(format!(
            "`{text}`: too long (at most {}d)",
            MAX_DURATION_SECS / 86_400
        )),
    }
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
        admin: AdminArgs<RELAY_ADMIN_PORT>,
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
        assert_eq!(demo.admin.admin_listen_addr.port(), 9091);
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

    #[test]
    fn durations_take_a_unit() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(
            parse_duration("45"),
            Err("`45`: expected a number and a unit (s, m, h, d), such as 90s or 6h".to_owned())
        );
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("3w").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn durations_that_overflow_are_errors() {
        // 300000000000000 days is more seconds than a u64 holds: it used to
        // wrap (release) or panic (debug).
        for text in [
            "300000000000000d",
            "99999999999999d",
            "18446744073709551615m",
            "36501d",
        ] {
            let error = parse_duration(text).unwrap_err();
            assert!(error.contains("too long") && error.contains(text), "{error}");
        }
        assert!(parse_duration("18446744073709551616s").is_err());
        assert_eq!(
            parse_duration("36500d"),
            Ok(Duration::from_secs(MAX_DURATION_SECS))
        );
    }
}
