//! Plan shapes: a statement's generic plan on a just-migrated database, in a
//! session set as a service's ([`service_session`]), read with EXPLAIN and
//! never timed. A table never analyzed is costed as ten pages, so a plan
//! made on a fresh deploy is where a statement that can read a table whole
//! does so; these helpers say which statements do.

use crate::TestDb;

/// A connection to `db` with a service's planner settings: generic plans
/// (as the ingest's pool; the relay's pool may choose them too) and index
/// paths only (`db::ConnectOptions::index_paths`).
pub async fn service_session(db: &TestDb) -> tokio_postgres::Client {
    db.database()
        .connect_with(&db::ConnectOptions {
            application_name: "plan-test",
            statement_timeout: None,
            lock_timeout: None,
            abort_when_client_leaves: false,
            asynchronous_commit: false,
            generic_plans: true,
            index_paths: true,
            pool_size: 1,
            pool_wait: std::time::Duration::from_secs(5),
        })
        .await
        .unwrap()
}

/// The generic plan of `sql` (a statement file: its `--` lines are dropped)
/// executed with `args` (SQL literals; their values do not matter to a
/// generic plan), as `EXPLAIN` prints it. `name` names the prepared
/// statement, so a session may explain several.
pub async fn generic_plan(client: &tokio_postgres::Client, name: &str, sql: &str, args: &str) -> String {
    let sql = sql
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    let args = if args.is_empty() {
        String::new()
    } else {
        format!("({args})")
    };
    let text = format!(
        "SET plan_cache_mode = force_generic_plan; PREPARE {name} AS {sql}; EXPLAIN EXECUTE {name}{args};"
    );
    client
        .simple_query(&text)
        .await
        .unwrap()
        .iter()
        .filter_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The lines of `plan` that read one of the product's tables other than by
/// an index probe: a whole-table scan, a bitmap of many entries, a hash or a
/// merge of a table's rows. Empty when every table is
/// reached by an index scan (or written: Insert, Update, Delete).
pub fn whole_table_reads(plan: &str) -> Vec<String> {
    const TABLES: [&str; 3] = ["processed_events", "orders", "outbox"];
    plan.lines()
        .filter(|line| {
            let node = line.trim_start().trim_start_matches("->").trim_start();
            let on_table = TABLES.iter().any(|table| {
                node.contains(&format!(" on {table}")) || node.contains(&format!(" on public.{table}"))
            });
            (on_table && (node.starts_with("Seq Scan") || node.starts_with("Bitmap Heap Scan")))
                || node.starts_with("Hash Join")
                || node.starts_with("Hash Semi Join")
                || node.starts_with("Hash Anti Join")
                || node.starts_with("Hash Left Join")
                || node.starts_with("Hash Right Join")
                || node.starts_with("Merge")
        })
        .map(str::to_owned)
        .collect()
}
