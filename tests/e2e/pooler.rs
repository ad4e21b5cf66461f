//! Behind PgBouncer 1.18 in transaction mode (`DATABASE_POOL_MODE=transaction`):
//! a pooler that keeps neither named prepared statements nor startup options
//! from one transaction to the next, with fewer server connections than the
//! services have clients, so every statement is multiplexed for real. The
//! same promises hold: one effect per event, replays byte for byte, a refund
//! cancels the unsent shipment; the relay LISTENs on a direct connection,
//! and the operator commands work through the pooler too.

use std::process::Command;
use std::time::Duration;

use futures_util::future::join_all;
use harness::{Stack, StackOptions, event};
use testkit::{PgBouncer, Role};

use crate::harness;

/// Distinct events posted at once: more than the pooler's server connections.
const BURST: i64 = 24;

#[tokio::test]
async fn both_services_keep_exactly_once_through_pgbouncer_in_transaction_mode() {
    let bouncer = PgBouncer::start(testkit::port_of(&testkit::admin_url())).expect("pgbouncer");
    let stack = Stack::start(StackOptions {
        through_pooler: Some(bouncer.port()),
        ..Default::default()
    })
    .await;
    for id in 1..=BURST + 1 {
        stack.insert_order(id, &format!("pay_{id}")).await;
    }
    a_duplicate_gets_the_same_bytes_back(&stack).await;
    a_burst_is_processed_once_per_event(&stack).await;
    a_refund_then_every_command_reaches_the_downstream_once(&stack).await;
    the_pooler_multiplexes_and_the_role_carries_the_settings(&stack, &bouncer).await;
    operator_commands_work_through_the_pooler(&stack, &bouncer).await;
}

/// A duplicate: the same bytes back, marked as a replay.
async fn a_duplicate_gets_the_same_bytes_back(stack: &Stack) {
    let first = stack
        .post(&event("evt_1", "payment.succeeded", "pay_1"), &[])
        .await;
    assert_eq!(first.status(), 200);
    let first_body = first.text().await.unwrap();
    let again = stack
        .post(&event("evt_1", "payment.succeeded", "pay_1"), &[])
        .await;
    assert_eq!(again.status(), 200);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.text().await.unwrap(), first_body);
}

/// One event delivered ten times at once, and distinct events for every
/// other order at the same moment: one of the ten processed.
async fn a_burst_is_processed_once_per_event(stack: &Stack) {
    let same = event("evt_burst", "payment.succeeded", &format!("pay_{}", BURST + 1));
    let distinct: Vec<String> = (2..=BURST)
        .map(|id| event(&format!("evt_{id}"), "payment.succeeded", &format!("pay_{id}")))
        .collect();
    let posts = (0..10)
        .map(|_| same.as_str())
        .chain(distinct.iter().map(String::as_str))
        .map(|body| stack.post(body, &[]));
    let responses = join_all(posts).await;
    let mut fresh_of_same = 0;
    for (i, r) in responses.into_iter().enumerate() {
        assert_eq!(r.status(), 200, "delivery {i} through the pooler");
        if i < 10 && r.headers().get("idempotent-replayed").is_none() {
            fresh_of_same += 1;
        }
    }
    assert_eq!(
        fresh_of_same, 1,
        "exactly one of the concurrent deliveries processed"
    );
}

/// A refund for order 1, then every command's effect counted.
async fn a_refund_then_every_command_reaches_the_downstream_once(stack: &Stack) {
    // A refund for order 1: refunded, one notice, its shipment cancelled if
    // the relay has not sent it yet, and nothing sent twice either way.
    let refund = stack
        .post(&event("evt_refund_1", "payment.refunded", "pay_1"), &[])
        .await;
    assert_eq!(refund.status(), 200);
    let body: serde_json::Value = refund.json().await.unwrap();
    assert_eq!(body["status"], "refunded");

    // Every command reaches the downstream once: 2 per paid order, 1 refund
    // notice, minus a shipment the refund cancelled in time.
    let open = "SELECT count(*) FROM outbox WHERE status = 'pending'";
    stack.wait_for(open, 0, Duration::from_secs(20)).await;
    let cancelled = stack
        .count("SELECT count(*) FROM outbox WHERE status = 'cancelled'")
        .await;
    let paid_orders = BURST + 1;
    let expected_effects = (2 * paid_orders + 1 - cancelled) as u64;
    let stats = stack.downstream.stats();
    assert_eq!(stats.double_effects, 0, "{stats:?}");
    assert_eq!(stats.effects, expected_effects, "{stats:?}");
    assert_eq!(
        stack
            .count("SELECT count(*) FROM outbox WHERE status = 'done'")
            .await as u64,
        expected_effects
    );
    assert_eq!(
        stack.count("SELECT count(*) FROM processed_events").await,
        BURST + 2
    );
    assert_eq!(
        stack
            .count("SELECT deliveries::int8 FROM processed_events WHERE event_id = 'evt_burst'")
            .await,
        10
    );
}

async fn the_pooler_multiplexes_and_the_role_carries_the_settings(stack: &Stack, bouncer: &PgBouncer) {
    // Multiplexed for real: the ingest's many client connections shared at
    // most the pooler's two server connections.
    let server_connections = stack
        .count(
            "SELECT count(*) FROM pg_stat_activity
              WHERE usename = 'webhook_test_ingest' AND datname = current_database()",
        )
        .await;
    assert!(
        (1..=2).contains(&server_connections),
        "{server_connections} server connections for the ingest"
    );
    let ingest_logins = bouncer
        .log()
        .lines()
        .filter(|l| l.contains("login attempt") && l.contains("user=webhook_test_ingest"))
        .count();
    assert!(
        ingest_logins > 2,
        "the ingest opened {ingest_logins} connections to the pooler"
    );
    // The settings the pooler cannot carry come from the role.
    let through = stack_url(stack, bouncer, Role::Ingest);
    let client = testkit::TestDb::connect_url(&through).await;
    let timeout = show(&client, "statement_timeout").await;
    assert_eq!(
        timeout.as_deref(),
        Some("5s"),
        "statement_timeout from ALTER ROLE ... SET"
    );
    // And so does the search_path the services' statements resolve names in
    // (the pooler dropped the test's own `-c search_path=...`).
    let path = show(&client, "search_path").await;
    assert_eq!(
        path.as_deref(),
        Some("pg_catalog"),
        "search_path from ALTER ROLE ... SET"
    );
    let (ok, out, err) = run(
        "webhook-ingest",
        &through,
        &["events", "list", "--json", "--status", "refunded"],
    );
    assert!(ok, "{err}");
    assert!(out.contains("evt_refund_1"), "{out}");
}

async fn operator_commands_work_through_the_pooler(stack: &Stack, bouncer: &PgBouncer) {
    // Operator commands through the pooler: prune (its lock is a
    // transaction lock) and stats, as the relay; events list, as the ingest.
    stack
        .client
        .batch_execute(
            "UPDATE outbox SET finished_at = now() - interval '30 days' WHERE status IN ('done', 'cancelled');
             UPDATE processed_events SET processed_at = now() - interval '30 days' WHERE event_id <> 'evt_1';",
        )
        .await
        .unwrap();
    let relay_url = stack_url(stack, bouncer, Role::Relay);
    let (ok, out, err) = run("outbox-relay", &relay_url, &["prune"]);
    assert!(ok, "{err}");
    assert!(out.contains("pruned"), "{out}");
    assert_eq!(
        stack
            .count("SELECT count(*) FROM outbox WHERE status IN ('done', 'cancelled')")
            .await,
        0
    );
    assert_eq!(stack.count("SELECT count(*) FROM processed_events").await, 1);
    let (ok, out, err) = run("outbox-relay", &relay_url, &["stats", "--json"]);
    assert!(ok, "{err}");
    let stats: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(stats["pending"], 0);
}

/// A setting as the session sees it.
async fn show(client: &tokio_postgres::Client, setting: &str) -> Option<String> {
    let shown = client.simple_query(&format!("SHOW {setting}")).await.unwrap();
    shown.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
        _ => None,
    })
}

/// The URL of the stack's database as `role` logs in to it through the pooler.
fn stack_url(stack: &Stack, bouncer: &PgBouncer, role: Role) -> String {
    bouncer.url(&stack._db.url_as(role))
}

fn run(binary: &str, database_url: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(testkit::bin::path(binary))
        .args(args)
        .env("DATABASE_URL", database_url)
        .env("DATABASE_POOL_MODE", "transaction")
        .env("RETENTION_DAYS", "7")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
