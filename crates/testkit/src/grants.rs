//! What a role may do, as the catalog records it and as the server enforces
//! it: the roles tests compare the migrations' grants with what each service
//! needs, and show that anything more is refused.

use tokio_postgres::error::SqlState;

/// One privilege a role holds on a table of the current schema, or on one
/// column of it (`column: Some(..)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub table: String,
    pub column: Option<String>,
    pub privilege: String,
}

impl Grant {
    fn target(&self) -> String {
        match &self.column {
            Some(column) => format!("{} ({column}) ON {}", self.privilege, self.table),
            None => format!("{} ON {}", self.privilege, self.table),
        }
    }

    pub fn revoke_sql(&self, role: &str) -> String {
        format!("REVOKE {} FROM {role}", self.target())
    }

    pub fn grant_sql(&self, role: &str) -> String {
        format!("GRANT {} TO {role}", self.target())
    }
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.target())
    }
}

/// Every privilege granted directly to `role` on the tables of the current
/// schema (table-level and column-level), as the catalog records them.
pub async fn grants_of(client: &tokio_postgres::Client, role: &str) -> Vec<Grant> {
    client
        .query(
            "SELECT c.relname::text AS table_name, NULL::text AS column_name, a.privilege_type
               FROM pg_class c, aclexplode(c.relacl) a
              WHERE a.grantee = $1::text::regrole AND c.relnamespace = current_schema()::regnamespace
             UNION ALL
             SELECT c.relname::text, att.attname::text, a.privilege_type
               FROM pg_class c JOIN pg_attribute att ON att.attrelid = c.oid, aclexplode(att.attacl) a
              WHERE a.grantee = $1::text::regrole AND c.relnamespace = current_schema()::regnamespace
              ORDER BY 1, 2, 3",
            &[&role],
        )
        .await
        .expect("reading the catalog's grants")
        .into_iter()
        .map(|r| Grant {
            table: r.get("table_name"),
            column: r.get("column_name"),
            privilege: r.get("privilege_type"),
        })
        .collect()
}

/// Panics unless `sql` fails for lack of a privilege (insufficient_privilege:
/// "permission denied", "must be owner").
pub async fn assert_refused(client: &tokio_postgres::Client, sql: &str) {
    match client.batch_execute(sql).await {
        Ok(()) => panic!("allowed, but should be refused: {sql}"),
        Err(e) => assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{sql}: {e:?}"),
    }
}

/// True when `result` failed for lack of a privilege.
pub fn is_refused<T>(result: &Result<T, tokio_postgres::Error>) -> bool {
    matches!(result, Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE))
}
