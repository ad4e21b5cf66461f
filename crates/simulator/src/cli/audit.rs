//! `simulator audit`: the database, the downstream, the relay's lease and
//! the window.

use std::path::PathBuf;
use std::time::Duration;

use reqwest::Url;

use crate::audit::AuditConfig;

#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// The database the ingest wrote (libpq URL; sslmode honoured).
    #[arg(
        long,
        env = "DATABASE_URL",
        value_name = "DATABASE_URL",
        hide_env_values = true
    )]
    pub database_url: process::Secret<String>,

    /// The downstream's base URL, as the relay's FULFILMENT_URL and EMAIL_URL.
    #[arg(long, env = "DOWNSTREAM_URL", value_name = "DOWNSTREAM_URL")]
    pub downstream: Url,

    /// The relay's lease: a shipment call arriving later than this after the
    /// order's refund cannot have been claimed before it.
    #[arg(long, env = "RELAY_LEASE_SECS", value_name = "RELAY_LEASE_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub lease_secs: u64,

    /// Only events and outbox rows of this many seconds back (by the
    /// database's clock) are counted, and only orders paid then need their
    /// confirmation at this downstream; default: everything.
    #[arg(long, env = "AUDIT_SINCE_SECS", value_name = "AUDIT_SINCE_SECS")]
    pub since_secs: Option<u64>,

    /// Also write the report as JSON to this file.
    #[arg(long, env = "AUDIT_JSON_FILE", value_name = "AUDIT_JSON_FILE")]
    pub json_file: Option<PathBuf>,
}

impl AuditArgs {
    /// The library's configuration; fails naming DATABASE_URL on a bad URL
    /// (without repeating it: it may hold a password).
    pub fn config(&self) -> Result<AuditConfig, String> {
        let database = db::Database::parse(self.database_url.expose())
            .map_err(|e| format!("--database-url (DATABASE_URL): {e}"))?;
        Ok(AuditConfig {
            database,
            downstream: self.downstream.clone(),
            lease: Duration::from_secs(self.lease_secs),
            since: self.since_secs.map(Duration::from_secs),
        })
    }
}
