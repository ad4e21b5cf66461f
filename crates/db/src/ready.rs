//! The database half of `/readyz`, shared by both services: the database
//! answers, and its schema is the one this binary needs.

use std::time::Duration;

use crate::pool::{Pool, PoolMode};
use tokio_postgres::types::Type;

use crate::sql::{Column, Sql, col};

/// What `/readyz` answers when the database cannot be reached or queried:
/// fixed, so no host, port, role or server message reaches whoever can read
/// the admin port. The detail goes to the log.
pub const UNAVAILABLE: &str = "database unavailable";

/// Why the database is not ready: what the client is told, and the detail
/// that only the log gets.
struct NotReady {
    public: String,
    detail: String,
}

/// Ok when a pooled connection answers within 2 s and the schema is current.
/// Else a short reason for the client: [`UNAVAILABLE`], or the schema's
/// state (not migrated, behind); the error's detail is logged (warn).
pub async fn check(pool: &Pool) -> Result<(), String> {
    probe(pool).await.map_err(|e| {
        if e.detail != e.public {
            tracing::warn!(detail = %e.detail, "not ready: {}", e.public);
        }
        e.public
    })
}

async fn probe(pool: &Pool) -> Result<(), NotReady> {
    let unavailable = |detail: String| NotReady {
        public: UNAVAILABLE.to_owned(),
        detail,
    };
    let client = tokio::time::timeout(Duration::from_secs(2), pool.get())
        .await
        .map_err(|_| unavailable("no connection within 2s".to_owned()))?
        .map_err(|e| unavailable(format!("database unreachable: {e}")))?;
    match crate::schema_status(&client).await {
        Ok(crate::SchemaStatus::Current) => Ok(()),
        Ok(status) => Err(NotReady {
            public: status.to_string(),
            detail: status.to_string(),
        }),
        Err(e) => Err(unavailable(format!("schema check: {e}"))),
    }
}

const ROLE_SETTINGS_COLUMNS: &[Column] = &[col("statement_timeout", Type::TEXT), col("role", Type::TEXT)];

/// The login role's own `statement_timeout`: what bounds a statement when
/// no startup `options` can (a transaction-mode pooler).
pub(crate) const ROLE_SETTINGS: Sql = Sql::new(
    "db/ready/role_settings.sql",
    include_str!("ready/role_settings.sql"),
    &[],
)
.returning(ROLE_SETTINGS_COLUMNS);

/// Says once, in one line, when the database is not ready at start-up, and
/// again when it becomes ready (no restart needed). Behind a transaction-mode
/// pooler, also says when the role sets no `statement_timeout`.
pub async fn announce(pool: Pool) {
    let mut complained = false;
    loop {
        match probe(&pool).await {
            Ok(()) => {
                if complained {
                    tracing::info!("database ready: schema current");
                }
                if pool.mode() == PoolMode::Transaction {
                    warn_without_role_timeout(&pool).await;
                }
                return;
            }
            Err(NotReady { detail, .. }) if !complained => {
                tracing::warn!("not ready: {detail}; /readyz answers 503 until it is");
                complained = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
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
