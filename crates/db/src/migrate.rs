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
//!
//! The migrations name their tables unqualified (V1..V3 are applied history,
//! whose text refinery checksums, comments included: a comment corrected
//! since is listed in [`REWORDED`]), so they run with `public` on the
//! session's `search_path`, where unqualified functions and operators resolve
//! too. [`migrate`] therefore first refuses a schema `public` in which anyone
//! but its owner, the migrating user and superusers may create objects
//! ([`UnsafeSchema`]): PostgreSQL 14 and earlier let every role create there,
//! and a function created there with exact argument types would run as the
//! migrating user.

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

/// The schema the migrations create everything in, and the services' statements
/// name (`public.outbox`).
pub const SCHEMA: &str = "public";

/// The newest migration version this binary knows.
pub fn expected_version() -> i32 {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| m.version())
        .max()
        .unwrap_or(0)
}

/// Comments corrected in applied migrations: (version, the checksum
/// refinery recorded for its text as first applied). Refinery refuses an
/// applied migration whose text differs from the embedded one, comments
/// included; [`migrate`] therefore rewrites exactly that recorded checksum
/// to the embedded text's ([`REWORD_CHECKSUM`]) and nothing else, and every
/// other difference is still refused. V1's comment named a section of a
/// document outside this repository; it now names docs/CONTRACT.md.
const REWORDED: &[(i32, u64)] = &[(1, 17_846_769_336_987_815_260)];

/// (version, the checksum of its text as first applied, the embedded text's)
/// for each migration of [`REWORDED`].
fn reworded_checksums() -> anyhow::Result<Vec<(i32, String, String)>> {
    let runner = embedded::migrations::runner();
    REWORDED
        .iter()
        .map(|&(version, applied)| {
            let migration = runner
                .get_migrations()
                .iter()
                .find(|m| m.version() == version)
                .with_context(|| format!("no embedded migration V{version}"))?;
            Ok((version, applied.to_string(), migration.checksum().to_string()))
        })
        .collect()
}

/// Rewrites a history checksum of [`REWORDED`] (the number of rows changed).
pub(crate) const REWORD_CHECKSUM: Sql = Sql::new(
    "db/migrate/reword_checksum.sql",
    include_str!("migrate/reword_checksum.sql"),
    &[Type::INT4, Type::TEXT, Type::TEXT],
);

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

const SET_SEARCH_PATH_COLUMNS: &[Column] = &[col("search_path", Type::TEXT)];

/// Sets the session's `search_path`.
pub(crate) const SET_SEARCH_PATH: Sql = Sql::new(
    "db/migrate/set_search_path.sql",
    include_str!("migrate/set_search_path.sql"),
    &[Type::TEXT],
)
.returning(SET_SEARCH_PATH_COLUMNS);

const PUBLIC_SCHEMA_CREATORS_COLUMNS: &[Column] =
    &[col("owner", Type::TEXT), col("creators", Type::TEXT_ARRAY)];

/// The owner of schema `public`, and who else may create objects in it.
pub(crate) const PUBLIC_SCHEMA_CREATORS: Sql = Sql::new(
    "db/migrate/public_schema_creators.sql",
    include_str!("migrate/public_schema_creators.sql"),
    &[],
)
.returning(PUBLIC_SCHEMA_CREATORS_COLUMNS);

/// Why [`migrate`] applied nothing: schema `public` is not one it may
/// resolve names in. Each is one line saying what to run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnsafeSchema {
    #[error(
        "schema {SCHEMA} does not exist, and the migrations create the tables there: \
         create it (CREATE SCHEMA {SCHEMA};) and migrate again"
    )]
    Missing,
    /// Roles other than the owner, the migrating user and superusers may
    /// create objects in it: `PUBLIC` (every role), or the roles named.
    #[error(
        "{} may create objects in schema {SCHEMA}, so {} could shadow a function or operator \
         the migrations call and run it as the migrating user: as the schema's owner ({owner}) \
         or a superuser, run REVOKE CREATE ON SCHEMA {SCHEMA} FROM {}; then migrate again",
        describe_creators(creators),
        if creators.iter().any(|c| c == "PUBLIC") { "any role" } else { "they" },
        creators.join(", ")
    )]
    Creators { owner: String, creators: Vec<String> },
}

fn describe_creators(creators: &[String]) -> String {
    let roles: Vec<&str> = creators
        .iter()
        .map(String::as_str)
        .filter(|c| *c != "PUBLIC")
        .collect();
    let public = creators.len() > roles.len();
    match (public, roles.as_slice()) {
        (true, []) => "PUBLIC (every role: the default before PostgreSQL 15)".to_owned(),
        (true, roles) => format!(
            "PUBLIC (every role: the default before PostgreSQL 15) and {}",
            roles.join(", ")
        ),
        (false, [role]) => format!("role {role}"),
        (false, roles) => format!("roles {}", roles.join(", ")),
    }
}

/// Ok when nobody untrusted may create objects in schema `public`
/// ([`PUBLIC_SCHEMA_CREATORS`]); run with the session's `search_path` at
/// `pg_catalog`.
async fn check_schema(client: &tokio_postgres::Client) -> anyhow::Result<()> {
    let row = PUBLIC_SCHEMA_CREATORS
        .query(client, &[])
        .await
        .context("reading who may create in schema public")?
        .into_iter()
        .next()
        .ok_or(UnsafeSchema::Missing)?;
    let creators: Vec<String> = row.get("creators");
    if creators.is_empty() {
        Ok(())
    } else {
        Err(UnsafeSchema::Creators {
            owner: row.get("owner"),
            creators,
        }
        .into())
    }
}

/// Applies every pending migration; returns the versions applied now.
///
/// Refuses, applying nothing, when schema `public` lets anyone untrusted
/// create objects in it ([`UnsafeSchema`]). Leaves the session's
/// `search_path` at `public` (it was the session's to choose before).
pub async fn migrate(client: &mut tokio_postgres::Client) -> anyhow::Result<Vec<i32>> {
    // The check resolves nothing in a schema someone else may have written to.
    SET_SEARCH_PATH
        .query_one(&*client, &[&crate::connect::SEARCH_PATH])
        .await
        .context("setting the search_path")?;
    check_schema(client).await?;
    // The migrations create their tables unqualified: in `public`, first on
    // the path (pg_catalog, not named, is still searched before it).
    SET_SEARCH_PATH
        .query_one(&*client, &[&SCHEMA])
        .await
        .context("setting the search_path")?;
    LOCK.execute(&*client, &[&MIGRATION_LOCK])
        .await
        .context("taking the migration lock")?;
    let result = async {
        reword(client).await?;
        embedded::migrations::runner()
            .set_abort_divergent(true)
            .run_async(client)
            .await
            .context("applying migrations")
    }
    .await;
    // Unlock even when a migration failed; the session ends soon anyway.
    let _ = UNLOCK.execute(&*client, &[&MIGRATION_LOCK]).await;
    let report = result?;
    Ok(report.applied_migrations().iter().map(|m| m.version()).collect())
}

/// Brings the history's checksums of [`REWORDED`] migrations, applied with
/// their first words, to the embedded text's (under the migration lock).
async fn reword(client: &tokio_postgres::Client) -> anyhow::Result<()> {
    let exists: bool = HISTORY_EXISTS
        .query_one(client, &[&format!("{SCHEMA}.{HISTORY_TABLE}")])
        .await
        .context("looking for the migration history")?
        .get("history_exists");
    if !exists {
        return Ok(());
    }
    for (version, applied, embedded) in reworded_checksums()? {
        let changed = REWORD_CHECKSUM
            .execute(client, &[&version, &applied, &embedded])
            .await
            .context("rewriting a reworded migration's checksum")?;
        if changed > 0 {
            tracing::info!(
                version,
                "migration history: V{version}'s corrected comment recorded"
            );
        }
    }
    Ok(())
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
    let row = HISTORY_EXISTS
        .query_one(client, &[&format!("{SCHEMA}.{HISTORY_TABLE}")])
        .await?;
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
        assert!(
            APPLIED_VERSION
                .text
                .contains(&format!("{SCHEMA}.{HISTORY_TABLE}"))
        );
    }

    #[test]
    fn an_unsafe_schema_says_what_to_revoke_in_one_line() {
        let public = UnsafeSchema::Creators {
            owner: "postgres".into(),
            creators: vec!["PUBLIC".into()],
        }
        .to_string();
        assert!(
            public.contains("REVOKE CREATE ON SCHEMA public FROM PUBLIC;"),
            "{public}"
        );
        assert!(public.contains("(postgres)"), "{public}");
        let roles = UnsafeSchema::Creators {
            owner: "webhooks_owner".into(),
            creators: vec!["PUBLIC".into(), "keda_app".into(), "\"Odd\"".into()],
        }
        .to_string();
        assert!(
            roles.contains("REVOKE CREATE ON SCHEMA public FROM PUBLIC, keda_app, \"Odd\";"),
            "{roles}"
        );
        for message in [public, roles, UnsafeSchema::Missing.to_string()] {
            assert!(!message.contains('\n'), "{message}");
        }
    }
}
