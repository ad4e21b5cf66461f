//! The migrations in `migrations/`, embedded in the binary.
//!
//! `webhook-ingest migrate` applies them under a Postgres advisory lock, so
//! several replicas (or a Job and a developer) may run it at once: one applies,
//! the others wait and then find nothing to do. Both services check
//! [`schema_status`] for `/readyz` and start serving once it is current,
//! without a restart.

use anyhow::Context as _;

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

/// Compares the applied migrations with the embedded ones.
pub async fn schema_status(client: &tokio_postgres::Client) -> Result<SchemaStatus, tokio_postgres::Error> {
    let row = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&HISTORY_TABLE])
        .await?;
    if !row.get::<_, bool>(0) {
        return Ok(SchemaStatus::Unmigrated);
    }
    let row = client
        .query_one(
            &format!("SELECT coalesce(max(version), 0)::int4 FROM {HISTORY_TABLE}"),
            &[],
        )
        .await?;
    let applied: i32 = row.get(0);
    let expected = expected_version();
    Ok(match applied {
        0 => SchemaStatus::Unmigrated,
        a if a >= expected => SchemaStatus::Current,
        a => SchemaStatus::Behind { applied: a, expected },
    })
}
