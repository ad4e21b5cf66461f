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

use crate::sql::{Column, Executor, Sql, col};

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

const LOCK_COLUMNS: &[Column] = &[col("pg_advisory_lock", Type::VOID)];

/// Waits for, then holds, the lock on migrating ([`MIGRATION_LOCK`]).
pub(crate) const LOCK: Sql = Sql::new(
    "db/migrate/lock.sql",
    include_str!("migrate/lock.sql"),
    &[Type::INT8],
)
.returning(LOCK_COLUMNS);

const UNLOCK_COLUMNS: &[Column] = &[col("pg_advisory_unlock", Type::BOOL)];

/// Releases [`LOCK`].
pub(crate) const UNLOCK: Sql = Sql::new(
    "db/migrate/unlock.sql",
    include_str!("migrate/unlock.sql"),
    &[Type::INT8],
)
.returning(UNLOCK_COLUMNS);

/// Applies every pending migration; returns the versions applied now.
pub async fn migrate(client: &mut tokio_postgres::Client) -> anyhow::Result<Vec<i32>> {
    LOCK.execute(&*client, &[&MIGRATION_LOCK])
        .await
        .context("taking the migration lock")?;
    let result = embedded::migrations::runner()
        .set_abort_divergent(true)
        .run_async(client)
        .await
        .context("applying migrations");
    // Unlock even when a migration failed; the session ends soon anyway.
    let _ = UNLOCK.execute(&*client, &[&MIGRATION_LOCK]).await;
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

const HISTORY_EXISTS_COLUMNS: &[Column] = &[col("history_exists", Type::BOOL)];

/// Whether the history table exists (no migration ever ran if not).
pub(crate) const HISTORY_EXISTS: Sql = Sql::new(
    "db/migrate/history_exists.sql",
    include_str!("migrate/history_exists.sql"),
    &[Type::TEXT],
)
.returning(HISTORY_EXISTS_COLUMNS);

const APPLIED_VERSION_COLUMNS: &[Column] = &[col("applied_version", Type::INT4)];

/// The newest applied version.
pub(crate) const APPLIED_VERSION: Sql = Sql::new(
    "db/migrate/applied_version.sql",
    include_str!("migrate/applied_version.sql"),
    &[],
)
.returning(APPLIED_VERSION_COLUMNS);

/// Compares the applied migrations with the embedded ones.
pub async fn schema_status(client: &(impl Executor + ?Sized)) -> Result<SchemaStatus, tokio_postgres::Error> {
    let row = HISTORY_EXISTS.query_one(client, &[&HISTORY_TABLE]).await?;
    if !row.get::<_, bool>("history_exists") {
        return Ok(SchemaStatus::Unmigrated);
    }
    let applied: i32 = APPLIED_VERSION
        .query_one(client, &[])
        .await?
        .get("applied_version");
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
    fn the_version_is_read_from_refinerys_table() {
        assert!(APPLIED_VERSION.text.contains(HISTORY_TABLE));
    }
}
