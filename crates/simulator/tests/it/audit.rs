//! `simulator audit` over a real database and a real downstream: orders and
//! processed events seeded by hand, effects made by real requests, each
//! per-order rule broken once and a clean history passing.

use std::time::Duration;

use simulator::audit::{self, AuditConfig, Report, Rule};
use testkit::TestDb;
use tokio::process::Command;

use crate::helpers::{TestDownstream, email, shipment, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_simulator");
const LEASE: Duration = Duration::from_secs(60);

/// Orders `(id, status)` and processed events `(order, type, status, seconds ago)`.
async fn seed(db: &TestDb, orders: &[(i64, &str)], events: &[(i64, &str, &str, u32)]) {
    let client = db.client().await;
    for (id, status) in orders {
        client
            .execute(
                "INSERT INTO orders (id, payment_id, status) VALUES ($1::bigint, 'pay_' || $1::bigint, $2)",
                &[id, status],
            )
            .await
            .unwrap();
    }
    for (n, (order, event_type, status, ago)) in events.iter().enumerate() {
        client
            .execute(
                "INSERT INTO processed_events (event_id, event_type, status, result, order_id, processed_at)
                 VALUES ($1, $2, $3, '{}', $4, now() - make_interval(secs => $5::int))",
                &[&format!("evt_{n}"), event_type, status, order, &(*ago as i32)],
            )
            .await
            .unwrap();
    }
}

/// Outbox rows `(kind, order, status)`, as the ingest and the relay leave them.
async fn commands(db: &TestDb, rows: &[(&str, i64, &str)]) {
    let client = db.client().await;
    for (kind, order, status) in rows {
        client
            .execute(
                "INSERT INTO outbox (kind, payload, idempotency_key, status, event_id, order_id)
                 VALUES ($1, '{}', $1 || '-' || $2::bigint, $3, 'evt_' || $2::bigint, $2::bigint)",
                &[kind, order, status],
            )
            .await
            .unwrap();
    }
}

async fn ship(sim: &TestDownstream, key: &str, order: i64) {
    assert_eq!(sim.post("/shipments", key, &shipment(order)).await.status, 201);
}

async fn send(sim: &TestDownstream, key: &str, order: i64, template: &str) {
    assert_eq!(
        sim.post("/emails", key, &email(order, template)).await.status,
        202
    );
}

fn config(db: &TestDb, sim: &TestDownstream, since: Option<Duration>) -> AuditConfig {
    AuditConfig {
        database: db.database(),
        downstream: sim.url.parse().unwrap(),
        lease: LEASE,
        since,
    }
}

fn examples(report: &Report, rule: Rule) -> Vec<i64> {
    report.finding(rule).examples.clone()
}

/// The binary as `make run` runs it: its exit status, stdout and JSON report.
async fn run_binary(db: &TestDb, sim: &TestDownstream) -> (bool, String, serde_json::Value) {
    let dir = std::env::temp_dir().join(format!("audit-{}", db.name));
    std::fs::create_dir_all(&dir).unwrap();
    let json_file = dir.join("audit.json");
    let out = Command::new(BIN)
        .args([
            "audit",
            "--downstream",
            &sim.url,
            "--lease-secs",
            "60",
            "--json-file",
        ])
        .arg(&json_file)
        .env("DATABASE_URL", &db.url)
        .env_remove("AUDIT_SINCE_SECS")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let json = serde_json::from_slice(&std::fs::read(&json_file).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    (out.status.success(), stdout, json)
}

#[tokio::test]
async fn every_rule_broken_once_is_reported_with_its_order() {
    let db = TestDb::new().await;
    seed(
        &db,
        &[
            (1, "paid"),
            (2, "refunded"),
            (3, "refunded"),
            (4, "paid"),
            (5, "paid"),
            (6, "paid"),
        ],
        &[
            // 1: a payment that changed nothing is no payment.
            (1, "payment.succeeded", "already_paid", 10),
            (2, "payment.succeeded", "processed", 300),
            // Refunded two minutes ago: a call arriving now is past the lease.
            (2, "payment.refunded", "refunded", 120),
            (3, "payment.succeeded", "processed", 300),
            (3, "payment.refunded", "refunded", 100),
            (4, "payment.succeeded", "processed", 10),
            (5, "payment.succeeded", "processed", 10),
            (6, "payment.succeeded", "processed", 10),
        ],
    )
    .await;
    let sim = spawn().await;
    ship(&sim, "ship-1", 1).await;
    ship(&sim, "ship-2", 2).await;
    for order in [2, 3, 4, 6] {
        send(&sim, &format!("conf-{order}"), order, "order_confirmation").await;
    }
    send(&sim, "refund-2", 2, "refund_notice").await;
    // The same notice under a second key: the downstream makes it twice.
    send(&sim, "refund-3", 3, "refund_notice").await;
    send(&sim, "refund-3-resent", 3, "refund_notice").await;
    send(&sim, "refund-4", 4, "refund_notice").await;
    ship(&sim, "ship-6", 6).await;
    ship(&sim, "ship-6-again", 6).await;

    let report = audit::run(&config(&db, &sim, None)).await.unwrap();
    assert_eq!(examples(&report, Rule::ShippedUnpaid), [1], "{report}");
    assert_eq!(examples(&report, Rule::ShippedAfterRefund), [2], "{report}");
    assert_eq!(examples(&report, Rule::RefundNoticeTwice), [3], "{report}");
    assert_eq!(examples(&report, Rule::RefundNoticeUnrefunded), [4], "{report}");
    assert_eq!(examples(&report, Rule::PaidUnconfirmed), [5], "{report}");
    let doubled = report.finding(Rule::DoubleEffects);
    assert_eq!((doubled.count, doubled.examples.clone()), (2, vec![3, 6]));
    assert_eq!(report.per_order.violations, 7);

    let (passed, table, json) = run_binary(&db, &sim).await;
    assert!(!passed, "{table}");
    assert!(
        table.contains("refunded orders shipped by a call started after refund + lease"),
        "{table}"
    );
    assert!(table.contains("7 violations"), "{table}");
    assert_eq!(json["violations"], 7);
    assert_eq!(json["findings"][1]["rule"], "shipped_after_refund");
    assert_eq!(json["findings"][1]["examples"], serde_json::json!([2]));
}

#[tokio::test]
async fn a_clean_history_passes_and_the_window_bounds_confirmations() {
    let db = TestDb::new().await;
    seed(
        &db,
        &[
            (10, "paid"),
            (11, "refunded"),
            (12, "refunded"),
            (13, "pending"),
            (14, "paid"),
        ],
        &[
            (10, "payment.succeeded", "processed", 20),
            (10, "payment.succeeded", "already_paid", 10),
            (11, "payment.succeeded", "processed", 100),
            // Refunded 30 s ago: a shipment arriving now is within the
            // lease, so it may have been claimed before the refund.
            (11, "payment.refunded", "refunded", 30),
            // The refund overtook the payment: nothing shipped or confirmed.
            (12, "payment.refunded", "refunded", 30),
            (12, "payment.succeeded", "order_refunded", 20),
            // Paid two hours ago, confirmed by a downstream long gone.
            (14, "payment.succeeded", "processed", 7200),
        ],
    )
    .await;
    commands(
        &db,
        &[
            ("ship_order", 10, "done"),
            ("send_confirmation", 10, "done"),
            ("ship_order", 11, "done"),
            ("send_confirmation", 11, "done"),
            ("send_refund_notice", 11, "done"),
            ("send_refund_notice", 12, "done"),
        ],
    )
    .await;
    let sim = spawn().await;
    ship(&sim, "ship-10", 10).await;
    send(&sim, "conf-10", 10, "order_confirmation").await;
    ship(&sim, "ship-11", 11).await;
    send(&sim, "conf-11", 11, "order_confirmation").await;
    send(&sim, "refund-11", 11, "refund_notice").await;
    send(&sim, "refund-12", 12, "refund_notice").await;
    // Retries of a key are one effect.
    ship(&sim, "ship-10", 10).await;
    send(&sim, "refund-11", 11, "refund_notice").await;

    let hour = Some(Duration::from_secs(3600));
    let report = audit::run(&config(&db, &sim, hour)).await.unwrap();
    assert!(report.passed(), "{report}");
    assert!(
        report
            .per_order
            .findings
            .iter()
            .all(|f| f.count == 0 && f.examples.is_empty())
    );

    let everything = audit::run(&config(&db, &sim, None)).await.unwrap();
    assert_eq!(examples(&everything, Rule::PaidUnconfirmed), [14], "{everything}");
    assert_eq!(everything.per_order.violations, 1);

    let mut command = Command::new(BIN);
    command
        .args(["audit", "--downstream", &sim.url, "--since-secs", "3600"])
        .env("DATABASE_URL", &db.url);
    let out = command.output().await.unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(table.contains("per-order rules: all held"), "{table}");
    // Payment 14 is older than the window: six events, each delivered once.
    assert!(
        table.contains(
            "exactly once: 2 shipments and 4 emails for 6 events and 6 deliveries; double effects 0"
        ),
        "{table}"
    );
}

/// Effects the outbox does not account for, or commands left undone, break
/// "exactly once" even when every per-order rule holds.
#[tokio::test]
async fn effects_against_commands_are_compared_in_totals() {
    let db = TestDb::new().await;
    seed(
        &db,
        &[(20, "paid"), (21, "paid")],
        &[
            (20, "payment.succeeded", "processed", 10),
            (21, "payment.succeeded", "processed", 10),
        ],
    )
    .await;
    commands(
        &db,
        &[
            ("ship_order", 20, "done"),
            ("send_confirmation", 20, "done"),
            ("ship_order", 21, "pending"),
            ("send_confirmation", 21, "done"),
        ],
    )
    .await;
    let sim = spawn().await;
    ship(&sim, "ship-20", 20).await;
    send(&sim, "conf-20", 20, "order_confirmation").await;
    send(&sim, "conf-21", 21, "order_confirmation").await;
    // An email no command asked for.
    send(&sim, "conf-21-stray", 22, "order_confirmation").await;

    let report = audit::run(&config(&db, &sim, None)).await.unwrap();
    assert!(report.per_order.passed(), "{report}");
    assert!(!report.passed(), "{report}");
    assert_eq!(
        report.exactly_once.problems,
        [
            "1 commands still pending, 0 dead",
            "emails at the downstream 3 != email commands delivered 2"
        ]
    );
    assert_eq!((report.totals.distinct_events, report.totals.deliveries), (2, 2));

    let (passed, table, json) = run_binary(&db, &sim).await;
    assert!(!passed, "{table}");
    assert!(
        table.contains("exactly once: NOT held: 1 commands still pending"),
        "{table}"
    );
    assert_eq!(json["exactly_once"]["held"], false);
    assert_eq!(json["downstream"]["emails"], 3);
    assert_eq!(
        json["commands"][0],
        serde_json::json!(["send_confirmation", "done", 2])
    );
}

#[tokio::test]
async fn an_unreachable_database_is_an_error_not_a_pass() {
    let sim = spawn().await;
    let out = Command::new(BIN)
        .args(["audit", "--downstream", &sim.url])
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "no table without a database");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("simulator: error: connecting to the database"),
        "{stderr}"
    );
}
