//! Connecting: a parsed `DATABASE_URL` ([`Database`]) and what each service
//! asks of its connections ([`ConnectOptions`]), for single connections here
//! and pools in [`crate::pool`].
//!
//! Reading the URL is `crate::url`'s job, TLS is `crate::tls`'s; this module
//! adds the settings every connection gets (timeouts, keepalives, the pinned
//! [`SEARCH_PATH`]) and the per-service session settings.

use std::time::Duration;

use anyhow::Context as _;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::mode::PoolMode;
pub use crate::url::DatabaseUrlError;

/// A connection's driver, as [`Database::connect_raw`] hands it over.
pub type Connection = tokio_postgres::Connection<
    tokio_postgres::Socket,
    <MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>>::Stream,
>;

/// The client, its driver polled by a task of its own until the connection closes.
fn spawn_driver((client, connection): (tokio_postgres::Client, Connection)) -> tokio_postgres::Client {
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "database connection closed");
        }
    });
    client
}

/// Where every session of the product resolves the names its statements do
/// not qualify: functions, operators and types in `pg_catalog` only. Every
/// connection made here (pools, single connections, the relay's `LISTEN`)
/// sends it, so a function or operator someone created in `public` (where
/// PostgreSQL 14 and earlier let every role create) is never a candidate,
/// however exactly its argument types match a call (CVE-2018-1058); the
/// product's statements name their tables `public.<table>`. Through a
/// transaction-mode pooler, which passes no startup options, the login role
/// carries it (`ALTER ROLE ... SET search_path = pg_catalog`,
/// deploy/sql/roles.sql) and `/readyz` checks it ([`crate::ready`]). The
/// migrations alone run with `public` on the path ([`crate::migrate`]).
pub const SEARCH_PATH: &str = "pg_catalog";

/// The session settings of [`ConnectOptions::index_paths`], as `name=value`
/// (through a transaction-mode pooler the login role carries them,
/// deploy/sql/roles.sql; the plan tests set them from here).
pub const INDEX_PATHS: [&str; 3] = [
    "enable_seqscan=off",
    "enable_hashjoin=off",
    "enable_mergejoin=off",
];

/// What each service asks of its connections.
///
/// The session settings below travel in the startup packet's `options`, which a
/// transaction-mode pooler does not pass on: when the database is reached in
/// [`PoolMode::Transaction`] they are not sent, and the login role must carry
/// them instead (`ALTER ROLE ... SET statement_timeout = ...`;
/// deploy/sql/roles.sql).
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Shown in `pg_stat_activity`, so an operator sees which service holds what.
    pub application_name: &'static str,
    /// Server-side bound on any one statement (`statement_timeout`).
    pub statement_timeout: Option<Duration>,
    /// Server-side bound on any one wait for a lock (`lock_timeout`): a
    /// statement that waits longer fails with `lock_not_available` (55P03),
    /// and its caller decides whether to try again without holding the
    /// connection meanwhile.
    pub lock_timeout: Option<Duration>,
    /// Have the server check for a vanished client while a statement runs
    /// (`client_connection_check_interval`, every 250 ms), so a statement
    /// whose connection closed (its process died, the pool discarded it) is
    /// rolled back instead of committing later. Polled, so it leaves a window;
    /// a caller that gives up on a statement cancels it with a [`Canceller`].
    pub abort_when_client_leaves: bool,
    /// Commit without waiting for the WAL flush (`synchronous_commit=off`).
    /// Only for writes that may be lost in a server crash without harm.
    pub asynchronous_commit: bool,
    /// Plan each prepared statement once per connection, for any parameters
    /// (`plan_cache_mode=force_generic_plan`). Postgres otherwise plans a
    /// statement anew on every execution while its custom plans look cheaper
    /// than the generic one, as they always do for a statement over arrays
    /// whose lengths the planner sees (measured: 0.74 ms of planning per
    /// execution of the ingest's batch statement, more than its execution).
    /// For services whose statements have one good plan whatever their
    /// parameters.
    pub generic_plans: bool,
    /// Reach rows by their indexes only (`enable_seqscan`, `enable_hashjoin`
    /// and `enable_mergejoin` off): for services whose every statement finds
    /// its rows by a key or a partial index. A never-analyzed table (a fresh
    /// deploy) is costed as ten pages, so a plan made then reads it whole,
    /// or hashes it, instead of probing an index; a cached plan keeps doing
    /// so as the table grows, on every pooled connection, until an
    /// autoanalyze happens to invalidate it (measured: the ingest's batch at
    /// 17.7 ms per call from a fresh database, 1.1 ms once analyzed). The
    /// planner still chooses among index paths by cost.
    pub index_paths: bool,
    /// Pool size: connections, not clients. Two cores saturate long before 16.
    pub pool_size: usize,
    /// How long a caller waits for a pooled connection (or a new one).
    pub pool_wait: Duration,
}

/// A parsed `DATABASE_URL`: connect once, or build a pool ([`Database::pool`]).
#[derive(Clone)]
pub struct Database {
    pub(crate) config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    /// Whether the URL leads to a transaction-mode pooler (`DATABASE_POOL_MODE`).
    pool_mode: PoolMode,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("target", &self.describe())
            .field("pool_mode", &self.pool_mode)
            .finish()
    }
}

impl Database {
    pub fn parse(url: &str) -> Result<Self, DatabaseUrlError> {
        let crate::url::ParsedUrl {
            mut config,
            server_certificate,
        } = crate::url::parse(url)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        // Notice a dead server or a silent network within seconds, not hours.
        config.keepalives_idle(Duration::from_secs(30));
        config.tcp_user_timeout(Duration::from_secs(20));
        Ok(Self {
            config,
            tls: crate::tls::connector(&server_certificate)?,
            pool_mode: PoolMode::Session,
        })
    }

    /// `host:port/dbname` for logs and errors, without credentials.
    pub fn describe(&self) -> String {
        let (host, port) = self.host_and_port();
        let db = self.config.get_dbname().unwrap_or("");
        format!("{host}:{port}/{db}")
    }

    /// The first host (a socket's folder for a Unix socket) and its port.
    pub(crate) fn host_and_port(&self) -> (String, u16) {
        let host = match self.config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
            None => "localhost".into(),
        };
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        (host, port)
    }

    /// The same target, reached through a pooler in `mode`: pools made from it
    /// then send what that pooler supports (see [`PoolMode`]).
    pub fn with_pool_mode(mut self, mode: PoolMode) -> Self {
        self.pool_mode = mode;
        self
    }

    pub fn pool_mode(&self) -> PoolMode {
        self.pool_mode
    }

    /// The same server and credentials, another database (tests, tools).
    pub fn with_dbname(&self, dbname: &str) -> Self {
        let mut other = self.clone();
        other.config.dbname(dbname);
        other
    }

    /// The connection settings for `options`: its application name, and its
    /// session settings unless a transaction-mode pooler would drop them.
    pub(crate) fn config_for(&self, options: &ConnectOptions) -> tokio_postgres::Config {
        let mut config = self.config.clone();
        config.application_name(options.application_name);
        if self.pool_mode == PoolMode::Transaction {
            return config;
        }
        let mut settings = vec![pinned_search_path()];
        if let Some(timeout) = options.statement_timeout {
            settings.push(format!("-c statement_timeout={}", timeout.as_millis()));
        }
        if let Some(timeout) = options.lock_timeout {
            settings.push(format!("-c lock_timeout={}", timeout.as_millis()));
        }
        if options.abort_when_client_leaves {
            settings.push("-c client_connection_check_interval=250".to_owned());
        }
        if options.asynchronous_commit {
            settings.push("-c synchronous_commit=off".to_owned());
        }
        if options.generic_plans {
            settings.push("-c plan_cache_mode=force_generic_plan".to_owned());
        }
        if options.index_paths {
            settings.extend(INDEX_PATHS.iter().map(|setting| format!("-c {setting}")));
        }
        add_options(&mut config, settings);
        config
    }

    pub(crate) fn tls(&self) -> &MakeRustlsConnect {
        &self.tls
    }

    /// One connection with `options`' session settings (its pool size and
    /// wait do not apply), its driver spawned on the current runtime.
    pub async fn connect_with(&self, options: &ConnectOptions) -> anyhow::Result<tokio_postgres::Client> {
        Ok(spawn_driver(self.open(self.config_for(options)).await?))
    }

    /// One connection (with the pinned [`SEARCH_PATH`]), its driver spawned
    /// on the current runtime.
    pub async fn connect(&self, application_name: &'static str) -> anyhow::Result<tokio_postgres::Client> {
        Ok(spawn_driver(self.connect_raw(application_name).await?))
    }

    /// One connection (with the pinned [`SEARCH_PATH`]) with its driver left
    /// to the caller, who must poll it (to receive notifications, for
    /// instance).
    pub async fn connect_raw(
        &self,
        application_name: &'static str,
    ) -> anyhow::Result<(tokio_postgres::Client, Connection)> {
        let mut config = self.config.clone();
        config.application_name(application_name);
        if self.pool_mode != PoolMode::Transaction {
            add_options(&mut config, [pinned_search_path()]);
        }
        self.open(config).await
    }

    /// One connection that resolves unqualified names the way PostgreSQL
    /// does by default (`search_path` `"$user", public`, whatever the login
    /// role sets), its driver spawned on the current runtime. For tests and
    /// tools that write `FROM outbox`; nothing of the product uses it, since
    /// a role that may create in `public` could shadow what such a session
    /// calls ([`SEARCH_PATH`]).
    pub async fn connect_with_default_search_path(
        &self,
        application_name: &'static str,
    ) -> anyhow::Result<tokio_postgres::Client> {
        let mut config = self.config.clone();
        config.application_name(application_name);
        if self.pool_mode != PoolMode::Transaction {
            add_options(&mut config, [r#"-c search_path="$user",public"#.to_owned()]);
        }
        Ok(spawn_driver(self.open(config).await?))
    }

    async fn open(
        &self,
        config: tokio_postgres::Config,
    ) -> anyhow::Result<(tokio_postgres::Client, Connection)> {
        config
            .connect(self.tls.clone())
            .await
            .with_context(|| format!("connecting to {}", self.describe()))
    }
}

/// `-c search_path=pg_catalog`, for the startup `options`.
fn pinned_search_path() -> String {
    format!("-c search_path={SEARCH_PATH}")
}

/// Appends `settings` (`-c name=value` each) to the URL's own `options`, so
/// that ours win over a setting the URL makes too.
fn add_options(config: &mut tokio_postgres::Config, settings: impl IntoIterator<Item = String>) {
    let existing = config.get_options().map(str::to_owned);
    config.options(existing.into_iter().chain(settings).collect::<Vec<_>>().join(" "));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_are_explained_without_the_url() {
        let err = Database::parse("postgres://u:secretpw@h/db?sslmode=sometimes").unwrap_err();
        assert!(err.to_string().contains("sometimes"));
        assert!(!err.to_string().contains("secretpw"));
        assert!(matches!(Database::parse("  "), Err(DatabaseUrlError::Empty)));
        assert!(matches!(
            Database::parse("postgres://h/db?sslmode=verify-full"),
            Err(DatabaseUrlError::MissingRootCert("verify-full"))
        ));
        assert!(matches!(
            Database::parse("postgres://h/db?sslmode=verify-ca&sslrootcert=/nonexistent.pem"),
            Err(DatabaseUrlError::RootCert(_))
        ));
        let err = Database::parse("postgres://u:secretpw@h/db?bogus=1").unwrap_err();
        assert!(!err.to_string().contains("secretpw"), "{err}");
    }

    #[test]
    fn describe_hides_credentials() {
        let db = Database::parse("postgres://user:hunter2@db.example:6543/shop?sslmode=require").unwrap();
        assert_eq!(db.describe(), "db.example:6543/shop");
        assert!(!format!("{db:?}").contains("hunter2"));
    }

    #[test]
    fn spans_name_the_database_and_the_server_without_credentials() {
        let db = Database::parse("postgres://user:hunter2@db.example:6543/shop?sslmode=require").unwrap();
        let server = db.span_server();
        assert_eq!(
            (server.namespace(), server.address(), server.port()),
            ("shop", "db.example", 6543)
        );
        let server = Database::parse("postgres://ingest_app@10.0.0.7")
            .unwrap()
            .span_server();
        assert_eq!(
            (server.namespace(), server.address(), server.port()),
            ("ingest_app", "10.0.0.7", 5432),
            "no database named: the server takes the user's name"
        );
    }
}
