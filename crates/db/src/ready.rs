//! The database half of `/readyz`, shared by both services: the database
//! answers, its sessions resolve names in `pg_catalog` alone
//! ([`crate::connect::SEARCH_PATH`]), and its schema is the one this binary
//! needs.

use std::time::Duration;

use crate::mode::PoolMode;
use crate::pool::Pool;
use tokio_postgres::types::Type;

use crate::sql::{Column, Sql, col};

/// What `/readyz` answers when the database cannot be reached or queried:
/// fixed, so no host, port, role or server message reaches whoever can read
/// the admin port. The detail goes to the log.
pub const UNAVAILABLE: &str = "database unavailable";

/// What `/readyz` answers when the service's sessions resolve names anywhere
/// but `pg_catalog`: the login role sets no `search_path = pg_catalog` and
/// the startup options that set it did not arrive (a transaction-mode
/// pooler, or a pooler told to ignore them). Not ready rather than a warning:
/// such a session calls whatever function or operator a role that may create
/// in a schema on its path put there. Fixed text; the role and its path go to
/// the log.
pub const UNSAFE_SEARCH_PATH: &str = "database search_path not pinned to pg_catalog";

/// Why the database is not ready: what the client is told, and the detail
/// that only the log gets.
struct NotReady {
    public: String,
    detail: String,
}

/// Ok when a pooled connection answers within 2 s, its session resolves
/// names in `pg_catalog` alone, and the schema is current. Else a short
/// reason for the client: [`UNAVAILABLE`], [`UNSAFE_SEARCH_PATH`], or the
/// schema's state (not migrated, behind); the cause and the setting to check
/// go to the log ([`say`]).
pub async fn check(pool: &Pool) -> Result<(), String> {
    let probed = probe(pool).await;
    say(pool, probed.as_ref().err());
    probed.map_err(|e| e.public)
}

/// Logs why the database is not ready once per change of cause (a warning
/// naming the setting to check), and that it is ready again (info): a
/// kubelet's probe every few seconds repeats nothing.
fn say(pool: &Pool, not_ready: Option<&NotReady>) {
    let mut said = pool
        .not_ready
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match not_ready {
        Some(e) if said.as_deref() != Some(e.detail.as_str()) => {
            tracing::warn!("not ready: {}; /readyz answers 503 until it is", e.detail);
            *said = Some(e.detail.clone());
        }
        None if said.take().is_some() => tracing::info!("database ready: schema current"),
        _ => {}
    }
}

/// Why no connection could be had, every layer of it ("db error: FATAL:
/// password authentication failed for user ...", "error connecting to
/// server: Connection refused"), and what to check. No host, port or
/// password: none of the errors carries one.
fn unreachable(e: &crate::PoolError) -> String {
    let (cause, check) = match e {
        crate::PoolError::Backend(e) => (crate::error_chain(e), crate::setting_to_check(e)),
        crate::PoolError::Timeout(_) => (
            "no connection in time".to_owned(),
            "the host and port in DATABASE_URL, and the network",
        ),
        _ => (crate::error_chain(e), "DATABASE_URL"),
    };
    format!("database unreachable: {cause}; check {check}")
}

async fn probe(pool: &Pool) -> Result<(), NotReady> {
    let unavailable = |detail: String| NotReady {
        public: UNAVAILABLE.to_owned(),
        detail,
    };
    let client = tokio::time::timeout(Duration::from_secs(2), pool.get())
        .await
        .map_err(|_| unavailable("no connection within 2s".to_owned()))?
        .map_err(|e| unavailable(unreachable(&e)))?;
    let settings = ROLE_SETTINGS
        .query_one(&client, &[])
        .await
        .map_err(|e| unavailable(format!("session settings: {e}")))?;
    let schemas: Vec<String> = settings.get("schemas");
    if !is_pinned(&schemas) {
        let (role, path): (String, String) = (settings.get("role"), settings.get("search_path"));
        return Err(NotReady {
            public: UNSAFE_SEARCH_PATH.to_owned(),
            detail: format!(
                "the session of role {role} resolves names in {schemas:?} (search_path {path}), \
                 where a role that may create objects can shadow what our statements call: \
                 ALTER ROLE {role} SET search_path = pg_catalog (deploy/sql/roles.sql); \
                 it applies to sessions opened after it"
            ),
        });
    }
    match crate::schema_status(&client).await {
        Ok(crate::SchemaStatus::Current) => Ok(()),
        Ok(status) => Err(NotReady {
            public: status.to_string(),
            detail: status.to_string(),
        }),
        Err(e) => Err(unavailable(format!("schema check: {e}"))),
    }
}

/// Whether a session resolving names in `schemas` (`current_schemas(false)`)
/// finds functions and operators in `pg_catalog` alone.
fn is_pinned(schemas: &[String]) -> bool {
    schemas.iter().all(|s| s == crate::connect::SEARCH_PATH)
}

const ROLE_SETTINGS_COLUMNS: &[Column] = &[
    col("statement_timeout", Type::TEXT),
    col("role", Type::TEXT),
    col("search_path", Type::TEXT),
    col("schemas", Type::TEXT_ARRAY),
];

/// The session's `statement_timeout` and `search_path`: behind a
/// transaction-mode pooler, which passes no startup `options`, the login
/// role's own.
pub(crate) const ROLE_SETTINGS: Sql = Sql::new(
    "db/ready/role_settings.sql",
    include_str!("ready/role_settings.sql"),
    &[],
)
.returning(ROLE_SETTINGS_COLUMNS);

/// Probes at start-up until the database is ready, saying why not once per
/// change of cause ([`say`]) and when it is (no restart needed). Behind a
/// transaction-mode pooler, also says when the role sets no
/// `statement_timeout` (a warning: statements are then unbounded, nothing
/// worse; an unpinned `search_path` keeps the service unready instead, see
/// [`UNSAFE_SEARCH_PATH`]).
pub async fn announce(pool: Pool) {
    while check(&pool).await.is_err() {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    if pool.mode() == PoolMode::Transaction {
        warn_without_role_timeout(&pool).await;
    }
}

async fn warn_without_role_timeout(pool: &Pool) {
    let Ok(client) = pool.get().await else { return };
    if let Ok(row) = ROLE_SETTINGS.query_one(&client, &[]).await {
        let (timeout, role): (String, String) = (row.get("statement_timeout"), row.get("role"));
        if timeout == "0" {
            tracing::warn!(
                "DATABASE_POOL_MODE=transaction and role {role} sets no statement_timeout: \
                 statements are unbounded on the server (ALTER ROLE {role} SET statement_timeout = ...)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_path_of_pg_catalog_alone_is_pinned() {
        let path = |s: &[&str]| s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(is_pinned(&path(&["pg_catalog"])));
        // No schema on the path at all: only the implicit pg_catalog resolves.
        assert!(is_pinned(&path(&[])));
        assert!(!is_pinned(&path(&["public"])));
        assert!(!is_pinned(&path(&["pg_catalog", "public"])));
        assert!(!is_pinned(&path(&["public", "pg_catalog"])));
    }
}
