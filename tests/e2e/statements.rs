//! Every SQL statement of the product, held against the migrated schema
//! before anything runs it (what `sqlx prepare --check` gives others).
//!
//! For each statement the crates list (`STATEMENTS`), on a freshly migrated
//! database:
//! - it prepares, with the parameter types the code declares, and the server
//!   infers exactly those types ([`db::sql::check`]);
//! - its result columns are, by name, type and position, the ones the code
//!   reads ([`db::Sql::returning`]);
//! - the role that runs it in production may run it: `EXPLAIN EXECUTE` as that
//!   role's login user plans it, and planning checks every table and column
//!   privilege, without executing anything;
//! - it names its tables: every session above resolves names in `pg_catalog`
//!   alone, as the services' do (`db::SEARCH_PATH`), so `FROM outbox` fails
//!   where `FROM public.outbox` prepares.
//!
//! And every `.sql` file under `crates/*/src` is one of those statements, so
//! a statement cannot escape the check by living outside a list.

use std::collections::BTreeSet;
use std::path::Path;

use db::Sql;
use testkit::{Role, TestDb};

/// Each crate's statements and the role that runs them in production
/// (`None`: run by an operator or a test tool as the schema's owner).
fn statements() -> Vec<(&'static Sql, Option<Role>)> {
    let mut all = Vec::new();
    all.extend(
        webhook_ingest::storage::STATEMENTS
            .iter()
            .map(|s| (*s, Some(Role::Ingest))),
    );
    all.extend(
        outbox_relay::storage::STATEMENTS
            .iter()
            .map(|s| (*s, Some(Role::Relay))),
    );
    // The KEDA trigger's count of due rows runs as the monitor role too.
    all.push((&outbox_relay::storage::COUNT_DUE, Some(Role::Monitor)));
    // The operator's console: its own statements, and the services' it runs.
    all.extend(
        ops_console::storage::STATEMENTS
            .iter()
            .chain(webhook_ingest::storage::CONSOLE_STATEMENTS)
            .chain(outbox_relay::storage::CONSOLE_STATEMENTS)
            .map(|s| (*s, Some(Role::Console))),
    );
    all.extend(db::STATEMENTS.iter().map(|s| (*s, None)));
    all.extend(simulator::audit::STATEMENTS.iter().map(|s| (*s, None)));
    all
}

#[tokio::test]
async fn every_statement_prepares_against_the_schema_with_the_declared_types_and_columns() {
    let test_db = TestDb::new().await;
    let owner = pinned(test_db.client().await).await;
    let mut problems = Vec::new();
    let mut as_role = Vec::new();
    for role in Role::ALL {
        as_role.push((
            role,
            pinned(TestDb::connect_url(&test_db.url_as(role)).await).await,
        ));
    }
    let statements = statements();
    for (sql, role) in &statements {
        if let Err(problem) = db::sql::check(&owner, sql).await {
            problems.push(problem);
            continue;
        }
        if let Some(role) = role {
            let client = &as_role.iter().find(|(r, _)| r == role).expect("every role").1;
            if let Err(problem) = plannable_as(client, sql).await {
                problems.push(format!("{} as {}: {problem}", sql.name, role.login()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {} statements disagree with the schema:\n{}",
        problems.len(),
        statements.len(),
        problems.join("\n")
    );
}

/// `client`, its session resolving names as the services' sessions do.
pub(crate) async fn pinned(client: tokio_postgres::Client) -> tokio_postgres::Client {
    client
        .batch_execute(&format!("SET search_path = {}", db::SEARCH_PATH))
        .await
        .expect("pinning the search_path");
    client
}

/// Plans `sql` with every parameter NULL (of its declared type), as the
/// connected role: the planner checks that role's privileges on every table
/// and column the statement reads or writes. Nothing is executed.
pub(crate) async fn plannable_as(client: &tokio_postgres::Client, sql: &Sql) -> Result<(), String> {
    let types: Vec<&str> = sql.types.iter().map(|t| t.name()).collect();
    let nulls = vec!["NULL"; types.len()].join(", ");
    let prepare = if types.is_empty() {
        format!("PREPARE checked AS {}", sql.text)
    } else {
        format!("PREPARE checked ({}) AS {}", types.join(", "), sql.text)
    };
    let explain = if types.is_empty() {
        "EXPLAIN EXECUTE checked".to_string()
    } else {
        format!("EXPLAIN EXECUTE checked ({nulls})")
    };
    let result = async {
        client.batch_execute(&prepare).await?;
        client.batch_execute(&explain).await
    }
    .await;
    let _ = client.batch_execute("DEALLOCATE ALL").await;
    result.map_err(|e| match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    })
}

#[test]
fn every_sql_file_in_the_crates_is_a_checked_statement() {
    let listed: BTreeSet<&str> = statements().iter().map(|(s, _)| s.text).collect();
    let root = testkit::workspace_root().join("crates");
    let mut files = Vec::new();
    sql_files(&root, &mut files);
    assert!(!files.is_empty(), "no .sql files under {}", root.display());
    let unlisted: Vec<String> = files
        .iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).expect("reading a .sql file");
            !listed.contains(text.as_str()) && !built_into(&text, &listed)
        })
        .map(|path| path.strip_prefix(&root).unwrap_or(path).display().to_string())
        .collect();
    assert!(
        unlisted.is_empty(),
        "these statements are in no crate's STATEMENTS, so nothing checks them: {unlisted:?}"
    );
}

/// Whether `text`, a statement with `-- include` lines or a step that
/// statements include (see webhook-ingest's build.rs), is built into one
/// listed statement: each of its parts between includes, its leading comment
/// left out, is in that statement.
fn built_into(text: &str, listed: &BTreeSet<&str>) -> bool {
    let body: Vec<&str> = text.lines().skip_while(|l| l.starts_with("--")).collect();
    let parts: Vec<String> = body
        .split(|l| l.starts_with("-- include"))
        .filter(|part| !part.is_empty())
        .map(|part| part.join("\n"))
        .collect();
    !parts.is_empty()
        && listed
            .iter()
            .any(|sql| parts.iter().all(|part| sql.contains(part.as_str())))
}

fn sql_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("reading the crates") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target" && n != "tests") {
                sql_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "sql") {
            out.push(path);
        }
    }
}
