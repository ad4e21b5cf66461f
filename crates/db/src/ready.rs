//! The database half of `/readyz`, shared by both services: the database
//! answers, and its schema is the one this binary needs.

use std::time::Duration;

/// Ok when a pooled connection answers within 2 s and the schema is current.
pub async fn check(pool: &deadpool_postgres::Pool) -> Result<(), String> {
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

/// Says once, in one line, when the database is not ready at start-up, and
/// again when it becomes ready (no restart needed).
pub async fn announce(pool: deadpool_postgres::Pool) {
    let mut complained = false;
    loop {
        match check(&pool).await {
            Ok(()) => {
                if complained {
                    tracing::info!("database ready: schema current");
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
