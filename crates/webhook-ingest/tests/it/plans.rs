//! The ingest's statements reach every row by an index on a just-migrated
//! database, planned generically in a session set as the ingest's pool
//! (testkit::plans): their cost per event never grows with the tables, from
//! the first request of a fresh deploy on, whatever statistics a pooled
//! connection planned with.

use testkit::plans::{generic_plan, service_session, whole_table_reads};

/// `n` NULL arguments: a generic plan does not depend on the values.
fn nulls(n: usize) -> String {
    vec!["NULL"; n].join(", ")
}

#[tokio::test]
async fn the_recording_statements_probe_indexes_on_a_fresh_database() {
    let db = testkit::TestDb::new().await;
    let client = service_session(&db).await;
    for (i, name) in [
        "record_events_batch.sql",
        "record_event.sql",
        "record_event.sql (refunds)",
        "replay_event.sql",
        "record_claim_only.sql",
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("webhook-ingest/{name}");
        let sql = webhook_ingest::storage::STATEMENTS
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("{name}"));
        let (sql, params) = (sql.text, sql.types.len());
        let plan = generic_plan(&client, &format!("statement_{i}"), sql, &nulls(params)).await;
        let reads = whole_table_reads(&plan);
        assert!(reads.is_empty(), "{name}: {reads:#?}\n{plan}");
    }
}

/// The reconciler's statements keep to the partial index of unmatched
/// events: their cost is the unmatched events, never the table. The oldest
/// unmatched event is the index's first entry (a `Limit`), not a `min()`
/// that reads every entry.
#[tokio::test]
async fn the_reconcilers_statements_walk_the_unmatched_index_on_a_fresh_database() {
    let db = testkit::TestDb::new().await;
    let client = service_session(&db).await;
    let mut plans = Vec::new();
    for (name, sql, args, entries) in [
        (
            "matchable",
            include_str!("../../src/storage/matchable_events.sql"),
            "now() - interval '1 hour', 200",
            1,
        ),
        (
            "backlog",
            include_str!("../../src/storage/unmatched_backlog.sql"),
            "now() - interval '72 hours', 10000",
            2,
        ),
    ] {
        let plan = generic_plan(&client, name, sql, args).await;
        assert!(whole_table_reads(&plan).is_empty(), "{name}: {plan}");
        assert_eq!(
            plan.matches("processed_events_unmatched_idx").count(),
            entries,
            "{name}: {plan}"
        );
        plans.push(plan);
    }
    let backlog = &plans[1];
    assert_eq!(
        backlog.matches("Limit").count(),
        2,
        "the oldest as the first entry: {backlog}"
    );
}
