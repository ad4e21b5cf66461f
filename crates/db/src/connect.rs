//! Connecting: `DATABASE_URL`, TLS, single connections and pools.
//!
//! tokio-postgres understands `sslmode=disable|prefer|require` but neither
//! certificate verification nor `sslrootcert`; managed databases are reached
//! with libpq's `verify-full`. So the URL is read here first: `sslmode` and
//! `sslrootcert` are taken out and turned into a rustls configuration, and the
//! rest goes to tokio-postgres as is.
//!
//! | sslmode | encrypted | server certificate checked |
//! |---|---|---|
//! | `disable` | no | - |
//! | `prefer` (default) | if the server offers it | no |
//! | `require` | yes | no (against `sslrootcert` if one is given, as libpq does) |
//! | `verify-ca` | yes | chain to `sslrootcert` |
//! | `verify-full` | yes | chain to `sslrootcert`, and the host name |

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use deadpool_postgres::{Manager, ManagerConfig, RecyclingMethod, Runtime};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::pool::{Client, Pool, PoolMode};

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

/// Why `DATABASE_URL` is unusable. The text never repeats the URL (it may
/// hold a password).
#[derive(Debug, thiserror::Error)]
pub enum DatabaseUrlError {
    #[error("is empty")]
    Empty,
    #[error("has an invalid sslmode `{0}` (disable, prefer, require, verify-ca, verify-full)")]
    SslMode(String),
    #[error("sets sslmode={0} without sslrootcert=<CA file>")]
    MissingRootCert(&'static str),
    #[error("names a CA file that cannot be read ({0})")]
    RootCert(String),
    #[error("cannot be parsed: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verify {
    Nothing,
    Chain,
    ChainAndName,
}

/// What each service asks of its connections.
///
/// The three settings below travel in the startup packet's `options`, which a
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
    /// Have the server check for a vanished client while a statement runs
    /// (`client_connection_check_interval`, every 250 ms), so a statement
    /// whose connection closed (its process died, the pool discarded it) is
    /// rolled back instead of committing later. Polled, so it leaves a window;
    /// a caller that gives up on a statement cancels it with a [`Canceller`].
    pub abort_when_client_leaves: bool,
    /// Commit without waiting for the WAL flush (`synchronous_commit=off`).
    /// Only for writes that may be lost in a server crash without harm.
    pub asynchronous_commit: bool,
    /// Pool size: connections, not clients. Two cores saturate long before 16.
    pub pool_size: usize,
    /// How long a caller waits for a pooled connection (or a new one).
    pub pool_wait: Duration,
}

/// A parsed `DATABASE_URL`: connect once, or build a pool.
#[derive(Clone)]
pub struct Database {
    config: tokio_postgres::Config,
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
        let url = url.trim();
        if url.is_empty() {
            return Err(DatabaseUrlError::Empty);
        }
        let (rest, sslmode, rootcert) = take_tls_params(url);
        let (mode, verify) = match sslmode.as_deref() {
            None | Some("prefer") => (SslMode::Prefer, Verify::Nothing),
            Some("allow") => (SslMode::Prefer, Verify::Nothing),
            Some("disable") => (SslMode::Disable, Verify::Nothing),
            Some("require") if rootcert.is_some() => (SslMode::Require, Verify::Chain),
            Some("require") => (SslMode::Require, Verify::Nothing),
            Some("verify-ca") => (SslMode::Require, Verify::Chain),
            Some("verify-full") => (SslMode::Require, Verify::ChainAndName),
            Some(other) => return Err(DatabaseUrlError::SslMode(other.to_owned())),
        };
        let mut config: tokio_postgres::Config = rest
            .parse()
            .map_err(|e: tokio_postgres::Error| DatabaseUrlError::Invalid(e.to_string()))?;
        config.ssl_mode(mode);
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        // Notice a dead server or a silent network within seconds, not hours.
        config.keepalives_idle(Duration::from_secs(30));
        config.tcp_user_timeout(Duration::from_secs(20));
        let tls = match verify {
            Verify::Nothing => accept_any_certificate(),
            Verify::Chain | Verify::ChainAndName => {
                let path = rootcert.ok_or(DatabaseUrlError::MissingRootCert(if verify == Verify::Chain {
                    "verify-ca"
                } else {
                    "verify-full"
                }))?;
                verify_with_root(&path, verify == Verify::ChainAndName)?
            }
        };
        Ok(Self {
            config,
            tls,
            pool_mode: PoolMode::Session,
        })
    }

    /// `host:port/dbname` for logs and errors, without credentials.
    pub fn describe(&self) -> String {
        let host = match self.config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
            None => "localhost".into(),
        };
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        let db = self.config.get_dbname().unwrap_or("");
        format!("{host}:{port}/{db}")
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

    fn config_for(&self, options: &ConnectOptions) -> tokio_postgres::Config {
        let mut config = self.config.clone();
        config.application_name(options.application_name);
        if self.pool_mode == PoolMode::Transaction {
            return config;
        }
        let mut settings = Vec::new();
        if let Some(timeout) = options.statement_timeout {
            settings.push(format!("-c statement_timeout={}", timeout.as_millis()));
        }
        if options.abort_when_client_leaves {
            settings.push("-c client_connection_check_interval=250".to_owned());
        }
        if options.asynchronous_commit {
            settings.push("-c synchronous_commit=off".to_owned());
        }
        if !settings.is_empty() {
            let existing = config.get_options().map(str::to_owned);
            config.options(existing.into_iter().chain(settings).collect::<Vec<_>>().join(" "));
        }
        config
    }

    /// One connection with `options`' session settings (its pool size and
    /// wait do not apply), its driver spawned on the current runtime.
    pub async fn connect_with(&self, options: &ConnectOptions) -> anyhow::Result<tokio_postgres::Client> {
        Ok(spawn_driver(self.open(self.config_for(options)).await?))
    }

    /// One connection, its driver spawned on the current runtime.
    pub async fn connect(&self, application_name: &'static str) -> anyhow::Result<tokio_postgres::Client> {
        Ok(spawn_driver(self.connect_raw(application_name).await?))
    }

    /// One connection with its driver left to the caller, who must poll it
    /// (to receive notifications, for instance).
    pub async fn connect_raw(
        &self,
        application_name: &'static str,
    ) -> anyhow::Result<(tokio_postgres::Client, Connection)> {
        let mut config = self.config.clone();
        config.application_name(application_name);
        self.open(config).await
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

    pub fn pool(&self, options: &ConnectOptions) -> Pool {
        let manager = Manager::from_config(
            self.config_for(options),
            self.tls.clone(),
            ManagerConfig {
                // A broken connection surfaces as an error on first use and
                // is then discarded; checking every checkout would cost a
                // round trip per request.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(options.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.pool_wait))
            .create_timeout(Some(options.pool_wait))
            .recycle_timeout(Some(options.pool_wait))
            .build()
            .expect("a pool with a runtime and timeouts always builds");
        Pool::new(pool, self.pool_mode)
    }

    /// Cancels statements on this database's connections; see [`Canceller`].
    pub fn canceller(&self) -> Canceller {
        Canceller {
            tls: self.tls.clone(),
        }
    }
}

/// Cancels a statement on the server: a cancel request (a new connection
/// carrying the session's key, which the server answers by interrupting that
/// session's statement), with the same TLS as the pool's connections, so
/// `sslmode=require` and `verify-full` hold for it too. PgBouncer forwards
/// cancel requests to the server session its client is linked to.
///
/// Giving up on a statement does not do this. Dropping its future leaves the
/// connection open and the server runs the statement on; closing the
/// connection is noticed only at the next `client_connection_check_interval`
/// poll, or, without one, when the server writes the result: after the commit.
#[derive(Clone)]
pub struct Canceller {
    tls: MakeRustlsConnect,
}

impl std::fmt::Debug for Canceller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Canceller").finish_non_exhaustive()
    }
}

impl Canceller {
    /// What [`Canceller::cancel`] needs to reach `client`'s server session:
    /// taken while the connection is at hand, before its statement is sent.
    pub fn session_of(&self, client: &Client) -> tokio_postgres::CancelToken {
        client.object().cancel_token()
    }

    /// Asks the server to cancel whatever `session` is running. `Ok` means
    /// the request was sent, not that a statement was cancelled: one that
    /// already finished is not affected, and the server does not answer.
    pub async fn cancel(&self, session: &tokio_postgres::CancelToken) -> Result<(), tokio_postgres::Error> {
        session.cancel_query(self.tls.clone()).await
    }
}

/// Splits `sslmode` and `sslrootcert` out of a URL or key=value string.
fn take_tls_params(url: &str) -> (String, Option<String>, Option<String>) {
    let mut sslmode = None;
    let mut rootcert = None;
    let mut take = |key: &str, value: &str| match key {
        "sslmode" => {
            sslmode = Some(value.to_owned());
            true
        }
        "sslrootcert" => {
            rootcert = Some(value.to_owned());
            true
        }
        _ => false,
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return (url.to_owned(), None, None);
        };
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                !take(k, &percent_decode(v))
            })
            .collect();
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        (rest, sslmode, rootcert)
    } else {
        let kept: Vec<&str> = url
            .split_whitespace()
            .filter(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                !take(k.trim(), v.trim().trim_matches('\''))
            })
            .collect();
        (kept.join(" "), sslmode, rootcert)
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn client_config(builder_verifier: Arc<dyn ServerCertVerifier>) -> MakeRustlsConnect {
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(builder_verifier)
        .with_no_client_auth();
    MakeRustlsConnect::new(config)
}

fn accept_any_certificate() -> MakeRustlsConnect {
    client_config(Arc::new(AcceptAnyCertificate(provider())))
}

fn verify_with_root(path: &str, check_name: bool) -> Result<MakeRustlsConnect, DatabaseUrlError> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| DatabaseUrlError::RootCert(format!("{path}: {e}")))?;
    for cert in certs {
        let cert = cert.map_err(|e| DatabaseUrlError::RootCert(format!("{path}: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| DatabaseUrlError::RootCert(format!("{path}: {e}")))?;
    }
    if roots.is_empty() {
        return Err(DatabaseUrlError::RootCert(format!(
            "{path}: no certificate in it"
        )));
    }
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| DatabaseUrlError::RootCert(format!("{path}: {e}")))?;
    Ok(client_config(Arc::new(ChainVerifier { webpki, check_name })))
}

/// `sslmode=require`/`prefer`: encryption without authentication, as libpq.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca` (chain only) and `verify-full` (chain and host name).
#[derive(Debug)]
struct ChainVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    check_name: bool,
}

impl ServerCertVerifier for ChainVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_params_are_taken_out_of_urls() {
        let (rest, mode, root) = take_tls_params(
            "postgres://u:p@h:5/db?sslmode=verify-full&application_name=x&sslrootcert=%2Ftmp%2Fca.pem",
        );
        assert_eq!(rest, "postgres://u:p@h:5/db?application_name=x");
        assert_eq!(mode.as_deref(), Some("verify-full"));
        assert_eq!(root.as_deref(), Some("/tmp/ca.pem"));
        let (rest, mode, root) = take_tls_params("postgres://h/db?sslmode=require");
        assert_eq!(
            (rest.as_str(), mode.as_deref(), root),
            ("postgres://h/db", Some("require"), None)
        );
        let (rest, mode, _) = take_tls_params("host=h dbname=d sslmode=disable");
        assert_eq!(
            (rest.as_str(), mode.as_deref()),
            ("host=h dbname=d", Some("disable"))
        );
    }

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
}
