//! The migrations in `migrations/`, embedded in the binary.
//!
//! `webhook-ingest migrate` applies them under a Postgres advisory lock, so
//! several replicas (or a Job and a developer) may run it at once: one applies,
//! the others wait and then find nothing to do. Both services check
//! [`schema_status`] for `/readyz` and start serving once it is current,
//! without a restart.
//!
//! Migrations need a direct connection (or a session-mode pooler): the lock
//! is a session lock held across the migration's statements, which a
//! transaction-mode pooler would hand to other clients' transactions. The
//! migrating user owns the tables it creates; the services' roles are granted
//! what they use (`migrations/V2__roles.sql`).

use anyhow::Context as _;
use tokio_postgres::types::Type;

use crate::sql::{Executor, Sql};

mod embedded {
    refinery::embed_migrations!("../../migrations");
}

/// Advisory lock key: any constant the product alone uses.
const MIGRATION_LOCK: i64 = 0x5745_4248_4f4f_4b31; // "WEBHOOK1"

/// Where refinery records applied migrations.
pub const HISTORY_TABLE: &str = "refinery_schema_history";

/// The newest migration version this binary knows.
pub fn expected_version() -> i32 {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| m.version())
        .max()
        .unwrap_or(0)
}

/// Applies every pending migration; returns the versions applied now.
pub async fn migrate(client: &mut tokio_postgres::Client) -> anyhow::Result<Vec<i32>> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .context("taking the migration lock")?;
    let result = embedded::migrations::runner()
        .set_abort_divergent(true)
        .run_async(client)
        .await
        .context("applying migrations");
    // Unlock even when a migration failed; the session ends soon anyway.
    let _ = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    let report = result?;
    Ok(report.applied_migrations().iter().map(|m| m.version()).collect())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaStatus {
    Current,
    /// No migration applied at all.
    Unmigrated,
    /// Some, not all: this binary is newer than the schema.
    Behind {
        applied: i32,
        expected: i32,
    },
}

impl std::fmt::Display for SchemaStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Current => f.write_str("schema current"),
            Self::Unmigrated => f.write_str("database not migrated: run `webhook-ingest migrate`"),
            Self::Behind { applied, expected } => write!(
                f,
                "schema at version {applied}, this release needs {expected}: run `webhook-ingest migrate`"
            ),
        }
    }
}

/// Whether the history table exists (no migration ever ran if not).
const HISTORY_EXISTS: Sql = Sql::new("history_exists", "SELECT to_regclass($1) IS NOT NULL", &[Type::TEXT]);

/// The newest applied version.
const APPLIED_VERSION: Sql = Sql::new("applied_version", 
    "SELECT coalesce(max(version), 0)::int4 FROM refinery_schema_history",
    &[],
);

/// Compares the applied migrations with the embedded ones.
pub async fn schema_status(client: &(impl Executor + ?Sized)) -> Result<SchemaStatus, tokio_postgres::Error> {
    let row = HISTORY_EXISTS.query_one(client, &[&HISTORY_TABLE]).await?;
    if !row.get::<_, bool>(0) {
        return Ok(SchemaStatus::Unmigrated);
    }
    let applied: i32 = APPLIED_VERSION.query_one(client, &[]).await?.get(0);
    let expected = expected_version();
    Ok(match applied {
        0 => SchemaStatus::Unmigrated,
        a if a >= expected => SchemaStatus::Current,
        a => SchemaStatus::Behind { applied: a, expected },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statements_read_refinerys_table() {
        assert!(APPLIED_VERSION.text.contains(HISTORY_TABLE));
        for sql in [&HISTORY_EXISTS, &APPLIED_VERSION] {
            assert_eq!(sql.placeholders(), sql.types.len(), "{}", sql.text);
        }
    }
}
