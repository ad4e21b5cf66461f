//! Exactly once per ORDER (docs/CONTRACT.md, section 7): the three ways
//! distinct events of one order broke it, each replayed as a test.
//!
//! 1. A payment and a refund at the same moment: the refund must stop the
//!    shipment the payment enqueued, whichever committed first.
//! 2. A refund while the shipment call is in flight: that call may still
//!    succeed (and the row then says `done`), but a failed call is never
//!    retried; and a call that did succeed is never recorded `cancelled`,
//!    even when its lease ran out before its outcome was recorded.
//! 3. A second refund after retention removed the first one's rows: no
//!    second notice.

use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use outbox_relay::storage::{self, RowVerdict, Verdict};
use testkit::Role;

use crate::harness::{Stack, StackOptions, event};

/// The relay stopped: rows stay as the ingest left them.
async fn stack_without_relay() -> Stack {
    let mut stack = Stack::start(StackOptions::default()).await;
    stack.relay.stop(Duration::from_secs(10));
    stack
}

async fn seed_orders(stack: &Stack, n: i64) {
    stack
        .client
        .execute(
            "INSERT INTO orders (id, payment_id) SELECT o, 'pay_' || o FROM generate_series(1, $1::int8) o",
            &[&n],
        )
        .await
        .unwrap();
}

async fn post_ok(stack: &Stack, id: &str, kind: &str, order: i64) -> serde_json::Value {
    let response = stack.post(&event(id, kind, &format!("pay_{order}")), &[]).await;
    assert_eq!(response.status(), 200, "{id}");
    response.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_and_a_refund_at_the_same_moment_leave_no_shipment_to_send() {
    const ORDERS: i64 = 1500;
    let stack = stack_without_relay().await;
    seed_orders(&stack, ORDERS).await;

    // Both events of each order sent at the same moment on two connections,
    // 16 such pairs in flight.
    let outcomes: Vec<(String, String)> = futures_util::stream::iter(1..=ORDERS)
        .map(|order| {
            let stack = &stack;
            async move {
                let (pay, refund) = (format!("evt_pay_{order}"), format!("evt_refund_{order}"));
                let (paid, refunded) = tokio::join!(
                    post_ok(stack, &pay, "payment.succeeded", order),
                    post_ok(stack, &refund, "payment.refunded", order),
                );
                (
                    paid["status"].as_str().unwrap().to_owned(),
                    refunded["status"].as_str().unwrap().to_owned(),
                )
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let payment_first = outcomes.iter().filter(|(p, _)| p == "processed").count();
    let refund_first = outcomes.iter().filter(|(p, _)| p == "order_refunded").count();
    eprintln!("{payment_first} payments committed first, {refund_first} refunds committed first");
    assert_eq!(payment_first + refund_first, ORDERS as usize);
    assert!(outcomes.iter().all(|(_, r)| r == "refunded"));
    assert!(
        payment_first > 0 && refund_first > 0,
        "both orders of commit were hit"
    );

    assert_eq!(
        stack
            .count("SELECT count(*) FROM orders WHERE status <> 'refunded'")
            .await,
        0
    );
    let to_ship = stack
        .count("SELECT count(*) FROM outbox WHERE kind = 'ship_order' AND status <> 'cancelled'")
        .await;
    assert_eq!(
        to_ship, 0,
        "{to_ship} refunded orders still have a shipment to send"
    );
    // One notice per order; a confirmation only for the payments that came first.
    assert_eq!(
        stack
            .count("SELECT count(*) FROM outbox WHERE kind = 'send_refund_notice'")
            .await,
        ORDERS
    );
    assert_eq!(
        stack
            .count("SELECT count(*) FROM outbox WHERE kind = 'send_confirmation'")
            .await,
        payment_first as i64
    );
}

/// The shipment call of each order is held at the downstream while its refund
/// commits; then it fails (order 1) or succeeds (order 2).
#[tokio::test]
async fn a_refund_while_the_shipment_call_is_in_flight_lets_only_that_call_finish() {
    let stack = Stack::start(StackOptions {
        relay_env: vec![
            ("RELAY_HTTP_TIMEOUT_MS", "5000".into()),
            ("RELAY_LEASE_SECS", "10".into()),
        ],
        ..Default::default()
    })
    .await;
    seed_orders(&stack, 2).await;
    let control = |path: &str, body: serde_json::Value| {
        let request = stack
            .http
            .post(format!("{}{path}", stack.downstream.url()))
            .json(&body);
        async move { assert!(request.send().await.unwrap().status().is_success()) }
    };
    control("/control/faults", serde_json::json!({"latency_ms": "1500"})).await;
    control(
        "/control/script",
        serde_json::json!({"key": "ship-1", "responses": [503]}),
    )
    .await;

    for order in [1, 2] {
        post_ok(&stack, &format!("evt_pay_{order}"), "payment.succeeded", order).await;
    }
    // Both shipment calls have reached the downstream and are being served.
    let started = Instant::now();
    while ["ship-1", "ship-2"].iter().any(|key| {
        stack
            .downstream
            .stats()
            .keys
            .as_ref()
            .and_then(|k| k.get(*key))
            .is_none_or(|k| k.requests == 0)
    }) {
        assert!(started.elapsed() < Duration::from_secs(10), "no shipment call");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for order in [1, 2] {
        let body = post_ok(&stack, &format!("evt_refund_{order}"), "payment.refunded", order).await;
        assert_eq!(body["status"], "refunded");
    }
    // Both calls answered and their outcomes recorded; then a while for any
    // retry (the backoff is 50 ms) to show.
    stack
        .wait_for(
            "SELECT count(*) FROM outbox WHERE kind = 'ship_order' AND lease_owner IS NULL AND status <> 'pending'",
            2,
            Duration::from_secs(20),
        )
        .await;
    stack
        .wait_for(
            "SELECT count(*) FROM outbox WHERE status = 'done' AND kind <> 'ship_order'",
            4,
            Duration::from_secs(20),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let stats = stack.downstream.stats();
    let failed = stats.key("ship-1");
    assert_eq!(
        (failed.requests, failed.effects),
        (1, 0),
        "the shipment whose call failed after the refund was called again"
    );
    let succeeded = stats.key("ship-2");
    assert_eq!((succeeded.requests, succeeded.effects), (1, 1));
    let row = async |order: i64| {
        stack
            .client
            .query_one(
                "SELECT status, last_error FROM outbox WHERE idempotency_key = 'ship-' || $1::int8",
                &[&order],
            )
            .await
            .unwrap()
    };
    let failed = row(1).await;
    assert_eq!(failed.get::<_, String>(0), "cancelled");
    let error: String = failed.get(1);
    assert!(
        error.contains("cancelled by evt_refund_1") && error.contains("HTTP 503"),
        "{error}"
    );
    assert_eq!(
        row(2).await.get::<_, String>(0),
        "done",
        "the call under way succeeded: the row says it shipped"
    );
}

/// The mirror case: a call succeeded, but its lease ran out before the relay
/// recorded it (a slow recorder), and the refund lands in between.
#[tokio::test]
async fn a_shipment_that_was_performed_is_recorded_done_even_when_a_refund_lands_after_its_lease() {
    let stack = stack_without_relay().await;
    seed_orders(&stack, 1).await;
    post_ok(&stack, "evt_pay_1", "payment.succeeded", 1).await;

    let pool = db::Database::parse(&stack._db.url_as(Role::Relay))
        .unwrap()
        .pool(&db::ConnectOptions {
            application_name: "stalled-relay",
            statement_timeout: Some(Duration::from_secs(10)),
            lock_timeout: None,
            abort_when_client_leaves: false,
            asynchronous_commit: false,
            generic_plans: false,
            index_paths: false,
            pool_size: 1,
            pool_wait: Duration::from_secs(5),
        });
    let client = pool.get().await.unwrap();
    let owner = "stalled-relay";
    let rows = storage::claim_due_batch(&client, 10, owner, Duration::from_millis(200), 25, None)
        .await
        .unwrap();
    let ship = rows
        .iter()
        .find(|r| r.kind == storage::RowKind::Known(domain::CommandKind::ShipOrder))
        .expect("the shipment claimed");
    // The call is made and succeeds...
    let response = stack
        .http
        .post(format!("{}/shipments", stack.downstream.url()))
        .header("Idempotency-Key", &ship.idempotency_key)
        .body(r#"{"order_id":1,"event_id":"evt_pay_1"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    // ...and its outcome waits past the lease while the refund commits.
    tokio::time::sleep(Duration::from_millis(400)).await;
    post_ok(&stack, "evt_refund_1", "payment.refunded", 1).await;
    let recorded = storage::record_verdicts(
        &client,
        owner,
        &[RowVerdict {
            id: ship.id,
            claim: ship.claim,
            verdict: Verdict::Done,
        }],
    )
    .await
    .unwrap();
    assert_eq!(recorded.len(), 1, "the shipment's success was fenced out");
    let status: String = stack
        .client
        .query_one("SELECT status FROM outbox WHERE id = $1", &[&ship.id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "done", "the downstream shipped it");
}

#[tokio::test]
async fn a_second_refund_after_retention_sends_no_second_notice() {
    let mut stack = Stack::start(StackOptions::default()).await;
    seed_orders(&stack, 2).await;
    post_ok(&stack, "evt_pay_1", "payment.succeeded", 1).await;
    let finished = "SELECT count(*) FROM outbox WHERE status IN ('done', 'cancelled')";
    stack.wait_for(finished, 2, Duration::from_secs(20)).await;
    post_ok(&stack, "evt_refund_1", "payment.refunded", 1).await;
    stack.wait_for(finished, 3, Duration::from_secs(20)).await;
    assert_eq!(stack.downstream.stats().key("refund-1").effects, 1);

    // Eight days on: the prune removes the order's rows and events.
    stack
        .client
        .batch_execute(
            "UPDATE outbox SET created_at = now() - interval '8 days', finished_at = now() - interval '8 days';
             UPDATE processed_events SET processed_at = now() - interval '8 days';",
        )
        .await
        .unwrap();
    let prune = std::process::Command::new(testkit::bin::path("outbox-relay"))
        .arg("prune")
        .env("DATABASE_URL", stack._db.url_as(Role::Relay))
        .env("RETENTION_DAYS", "7")
        .env("FULFILMENT_URL", stack.downstream.url())
        .env("EMAIL_URL", stack.downstream.url())
        .output()
        .unwrap();
    assert!(prune.status.success(), "{prune:?}");
    assert_eq!(stack.count("SELECT count(*) FROM outbox").await, 0);
    assert_eq!(stack.count("SELECT count(*) FROM processed_events").await, 0);
    // A real email API forgets idempotency keys long before that.
    let reset = stack
        .http
        .post(format!("{}/control/reset", stack.downstream.url()))
        .send()
        .await
        .unwrap();
    assert!(reset.status().is_success());

    // A second, distinct refund; the first one resent (its dedup row is
    // gone, so it is processed anew); the payment resent.
    let second = post_ok(&stack, "evt_refund_1_again", "payment.refunded", 1).await;
    assert_eq!(second["status"], "refunded");
    let resent = post_ok(&stack, "evt_refund_1", "payment.refunded", 1).await;
    assert_eq!(resent["status"], "refunded");
    let payment = post_ok(&stack, "evt_pay_1", "payment.succeeded", 1).await;
    assert_eq!(payment["status"], "order_refunded");
    // Another order's payment, through the same relay, shows it is draining.
    post_ok(&stack, "evt_pay_2", "payment.succeeded", 2).await;
    stack
        .wait_for(
            "SELECT count(*) FROM outbox WHERE order_id = 2 AND status = 'done'",
            2,
            Duration::from_secs(20),
        )
        .await;
    stack.relay.stop(Duration::from_secs(10));

    assert_eq!(
        stack
            .count("SELECT count(*) FROM outbox WHERE order_id = 1 AND kind <> 'ship_order'")
            .await,
        0,
        "a second refund notice was enqueued"
    );
    let stats = stack.downstream.stats();
    let keys = stats.keys.as_ref().unwrap();
    assert!(
        !keys.contains_key("refund-1") && !keys.contains_key("ship-1"),
        "order 1 got calls after retention: {:?}",
        keys.keys().collect::<Vec<_>>()
    );
}
