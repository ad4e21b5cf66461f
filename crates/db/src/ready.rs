//! The database half of `/readyz`, shared by both services: the database
//! answers, and its schema is the one this binary needs.

use std::time::Duration;

use crate::pool::{Pool, PoolMode};
use tokio_postgres::types::Type;

use crate::sql::{Column, Sql, col};

/// Ok when a pooled connection answers within 2 s and the schema is current.
pub async fn check(pool: &Pool) -> Result<(), String> {
    let client = tokio::time::timeout(Duration::from_secs(2), pool.get())
        .await
        .map_err(|_| "database: no connection within 2s".to_owned())?
        .map_err(|e| format!("database unreachable: {e}"))?;
    match crate::schema_status(&client).await {
        Ok(crate::SchemaStatus::Current) => Ok(()),
        Ok(status) => Err(status.to_string()),
        Err(e) => Err(format!("database: {e}")),
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
        match check(&pool).await {
            Ok(()) => {
                if complained {
                    tracing::info!("database ready: schema current");
                }
                if pool.mode() == PoolMode::Transaction {
                    warn_without_role_timeout(&pool).await;
                }
                return;
            }
            Err(reason) if !complained => {
                tracing::warn!("not ready: {reason}; /readyz answers 503 until it is");
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
