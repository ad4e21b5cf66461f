//! The console's own statements reach rows by index on a just-migrated
//! database (a plan made there is the one that would read a table whole;
//! `testkit::plans`), so its pages cost the same on a fresh deploy and over a
//! week of history: an order by its primary key or unique payment id, the
//! unmatched payments by their partial index, each one's order by its
//! payment id.

use testkit::plans::{generic_plan, service_session, whole_table_reads};

#[tokio::test]
async fn the_consoles_statements_probe_indexes_on_a_fresh_database() {
    let db = testkit::TestDb::new().await;
    let client = service_session(&db).await;
    for (name, sql, args, indexes) in [
        (
            "find_order",
            include_str!("../../../crates/ops-console/src/storage/find_order.sql"),
            "1, 'pay_1'",
            &["orders_pkey", "orders_payment_id_key"][..],
        ),
        (
            "unmatched_page",
            include_str!("../../../crates/ops-console/src/storage/unmatched_page.sql"),
            "NULL, NULL, 50, NULL",
            &["processed_events_unmatched_idx", "orders_payment_id_key"][..],
        ),
    ] {
        let plan = generic_plan(&client, name, sql, args).await;
        assert_eq!(whole_table_reads(&plan), Vec::<String>::new(), "{name}:\n{plan}");
        for index in indexes {
            assert!(plan.contains(index), "{name} uses {index}:\n{plan}");
        }
    }
}
