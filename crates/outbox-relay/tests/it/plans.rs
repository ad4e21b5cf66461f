//! The relay's statements reach every row by an index on a just-migrated
//! database, planned generically in a session set as the relay's pool
//! (testkit::plans; the relay's pool plans custom first, and keeps a generic
//! plan once it looks as cheap, which on a new table it does): the claim,
//! the completion, the backlog gauges and the prune cost the same from the
//! first row of a fresh deploy to an outage's backlog.

use testkit::plans::{generic_plan, service_session, whole_table_reads};

#[tokio::test]
async fn the_relays_statements_probe_indexes_on_a_fresh_database() {
    let db = testkit::TestDb::new().await;
    let client = service_session(&db).await;
    for (name, sql, args, index) in [
        (
            "claim",
            include_str!("../../src/storage/claim.sql"),
            "64, 'relay', 30000, 5, NULL",
            "outbox_due_idx",
        ),
        (
            "complete",
            include_str!("../../src/storage/complete.sql"),
            "NULL, NULL, NULL, NULL, NULL, 'relay'",
            "outbox_pkey",
        ),
        (
            "still_pending",
            include_str!("../../src/storage/still_pending.sql"),
            "1, 'relay', 1",
            "Index Scan",
        ),
        (
            "backlog",
            include_str!("../../src/storage/backlog.sql"),
            "",
            "outbox_due_idx",
        ),
        (
            "backlog_due",
            include_str!("../../src/storage/backlog_due.sql"),
            "",
            "outbox_due_idx",
        ),
        (
            "prune_outbox",
            include_str!("../../src/storage/prune_outbox.sql"),
            "7, 1000, 1",
            "outbox_finished_idx",
        ),
        (
            "prune_events",
            include_str!("../../src/storage/prune_events.sql"),
            "7, 1000, 1",
            "processed_events_processed_at_idx",
        ),
    ] {
        let plan = generic_plan(&client, name, sql, args).await;
        let reads = whole_table_reads(&plan);
        assert!(reads.is_empty(), "{name}: {reads:#?}\n{plan}");
        assert!(plan.contains(index), "{name}: {index} expected:\n{plan}");
    }
}

/// The prunes delete the rows their retention index found by ctid, never by
/// probing the primary key: processed_events' key holds random text ids, and
/// a batch's probes read random leaf pages into the shared buffers the
/// ingest needs (docs/BENCHMARK.md, "What bounds each figure").
#[tokio::test]
async fn the_prunes_delete_by_ctid_without_probing_the_primary_key() {
    let db = testkit::TestDb::new().await;
    let client = service_session(&db).await;
    for (name, sql, pkey) in [
        (
            "prune_outbox",
            include_str!("../../src/storage/prune_outbox.sql"),
            "outbox_pkey",
        ),
        (
            "prune_events",
            include_str!("../../src/storage/prune_events.sql"),
            "processed_events_pkey",
        ),
    ] {
        let plan = generic_plan(&client, name, sql, "7, 1000, 1").await;
        assert!(plan.contains("Tid Scan"), "{name}: a Tid Scan expected:\n{plan}");
        assert!(!plan.contains(pkey), "{name}: {pkey} probed:\n{plan}");
    }
}
