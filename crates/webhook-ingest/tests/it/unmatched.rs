//! Payments that arrive before their orders (docs/CONTRACT.md, "Payments
//! before their orders"): applied by the ingest's reconciler once the order
//! exists, with no operator; left to an operator past the retry horizon,
//! counted and alerted on; discarded by an operator with a reason.

use std::time::{Duration, Instant};

use testkit::Role;

use crate::helpers::{TestApp, event, spawn_app, spawn_app_on};

fn ingest_cli(app: &TestApp, args: &[&str]) -> (bool, String, String) {
    let url = app.db.as_ref().unwrap().url_as(Role::Ingest);
    testkit::run_cli(env!("CARGO_BIN_EXE_webhook-ingest"), &url, args)
}

async fn status_of(app: &TestApp, id: &str) -> String {
    app.client
        .query_one("SELECT status FROM processed_events WHERE event_id = $1", &[&id])
        .await
        .unwrap()
        .get(0)
}

/// Waits (up to 10 s) until `id`'s status is no longer `unmatched`; how long.
async fn until_applied(app: &TestApp, id: &str) -> Duration {
    let started = Instant::now();
    while status_of(app, id).await == "unmatched" {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{id} still unmatched 10 s after its order exists: nothing applied it"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

/// The usual race: the provider's webhook first, the shop's order a moment
/// later. No operator: the payment pays the order and enqueues its commands
/// within about a second, once; a refund that also came early is applied
/// after it, in the order they arrived; later deliveries get the new answer.
#[tokio::test]
async fn payments_before_their_orders_are_applied_by_themselves_once_the_order_exists() {
    let app = spawn_app().await;
    let pay = event("evt_early_pay", "payment.succeeded", "pay_41");
    let first: serde_json::Value = app.post(&pay).await.json().await.unwrap();
    assert_eq!(first["status"], "unmatched");
    let other = event("evt_early_other", "payment.succeeded", "pay_42");
    assert_eq!(app.post(&other).await.status(), 200);
    let refund = event("evt_early_refund", "payment.refunded", "pay_42");
    assert_eq!(app.post(&refund).await.status(), 200);

    app.insert_order(41, "pay_41", "pending").await;
    let took = until_applied(&app, "evt_early_pay").await;
    eprintln!(
        "unmatched payment applied {} ms after its order was committed",
        took.as_millis()
    );
    assert_eq!(status_of(&app, "evt_early_pay").await, "processed");
    assert_eq!(app.order_status(41).await, "paid");
    let rows: Vec<(String, String)> = app
        .text_pairs("SELECT kind, event_id FROM outbox WHERE order_id = 41 ORDER BY kind")
        .await;
    assert_eq!(
        rows,
        [
            ("send_confirmation".to_owned(), "evt_early_pay".to_owned()),
            ("ship_order".to_owned(), "evt_early_pay".to_owned())
        ]
    );
    let again = app.post(&pay).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let body: serde_json::Value = again.json().await.unwrap();
    assert_eq!(
        (body["status"].as_str(), body["order_id"].as_i64()),
        (Some("processed"), Some(41))
    );

    // Two early events of one order: the payment first (it came first), then
    // the refund, as the domain rules apply them in that order.
    app.insert_order(42, "pay_42", "pending").await;
    until_applied(&app, "evt_early_other").await;
    until_applied(&app, "evt_early_refund").await;
    assert_eq!(status_of(&app, "evt_early_other").await, "processed");
    assert_eq!(status_of(&app, "evt_early_refund").await, "refunded");
    assert_eq!(app.order_status(42).await, "refunded");
    let rows: Vec<(String, String)> = app
        .text_pairs("SELECT kind, status FROM outbox WHERE order_id = 42 ORDER BY kind")
        .await;
    assert_eq!(
        rows,
        [
            ("send_confirmation".to_owned(), "pending".to_owned()),
            ("send_refund_notice".to_owned(), "pending".to_owned()),
            ("ship_order".to_owned(), "cancelled".to_owned()),
        ]
    );

    // Applied once each, whatever else looks: nothing more after more sweeps.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(app.count("SELECT count(*) FROM outbox").await, 5);
    let m = app.metrics().await;
    assert_eq!(m.get("webhook_unmatched_applied_total", &[]), 3.0);
}

/// Past the provider's retry horizon an unmatched event is no longer applied
/// by itself: the gauges count it for the alert, and an operator replays it
/// (or discards it). A young one beside it is applied as usual.
#[tokio::test]
async fn an_unmatched_event_past_the_horizon_waits_for_an_operator_and_is_counted() {
    let db = testkit::TestDb::new().await;
    let setup = db.client().await;
    // Recorded as the ingest records them, one 73 hours ago.
    for (id, payment, age) in [
        ("evt_old", "pay_51", "73 hours"),
        ("evt_young", "pay_52", "1 minute"),
    ] {
        let payload = event(id, "payment.succeeded", payment);
        setup
            .execute(
                "INSERT INTO processed_events (event_id, event_type, status, result, payload, processed_at)
                 VALUES ($1, 'payment.succeeded', 'unmatched',
                         jsonb_build_object('event_id', $1::text, 'status', 'unmatched'),
                         $2::text::jsonb, now() - $3::text::interval)",
                &[&id, &payload, &age],
            )
            .await
            .unwrap();
    }
    setup
        .batch_execute("INSERT INTO orders (id, payment_id) VALUES (51, 'pay_51'), (52, 'pay_52')")
        .await
        .unwrap();
    let mut app = spawn_app_on(&db.url, &["--unmatched-horizon-hours", "72"]).await;
    app.db = Some(db);

    until_applied(&app, "evt_young").await;
    // Several sweeps later, the old one is still waiting, and counted.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(status_of(&app, "evt_old").await, "unmatched");
    assert_eq!(app.order_status(51).await, "pending");
    let m = app.metrics().await;
    assert_eq!(m.get("webhook_unmatched_past_horizon_events", &[]), 1.0);
    let age = m.get("webhook_unmatched_oldest_age_seconds", &[]);
    assert!((73.0 * 3600.0..74.0 * 3600.0).contains(&age), "{age}");

    let (ok, out, err) = ingest_cli(&app, &["events", "replay", "evt_old"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("replayed evt_old: processed, order 51"), "{out}");
    assert_eq!(app.order_status(51).await, "paid");
}

/// `events discard <id> --reason`: an unmatched event that will never match
/// is kept with the reason and the time, no longer applied by itself (even
/// when an order with its payment id appears later) nor counted; the
/// provider's resend still gets the answer it was given. Only an unmatched
/// event is discarded, and only once.
#[tokio::test]
async fn an_operator_discards_an_unmatched_event_with_a_reason_and_it_is_kept() {
    let app = spawn_app().await;
    let body = event("evt_stray", "payment.succeeded", "pay_61");
    let answer: serde_json::Value = app.post(&body).await.json().await.unwrap();
    assert_eq!(answer["status"], "unmatched");

    let (ok, _, err) = ingest_cli(&app, &["events", "discard", "evt_stray"]);
    assert!(!ok && err.contains("--reason"), "a reason is required: {err}");
    let (ok, _, err) = ingest_cli(&app, &["events", "discard", "evt_stray", "--reason", ""]);
    assert!(!ok, "an empty reason is refused: {err}");
    let (ok, out, err) = ingest_cli(
        &app,
        &[
            "events",
            "discard",
            "evt_stray",
            "--reason",
            "a test payment from the provider's dashboard",
        ],
    );
    assert!(ok, "{err}");
    assert!(out.starts_with("discarded evt_stray at "), "{out}");
    let (ok, out, _) = ingest_cli(&app, &["events", "discard", "evt_stray", "--reason", "again"]);
    assert!(
        ok && out.starts_with("unchanged: evt_stray was discarded already"),
        "{out}"
    );

    let (ok, shown, err) = ingest_cli(&app, &["events", "show", "evt_stray", "--json"]);
    assert!(ok, "{err}");
    let shown: serde_json::Value = serde_json::from_str(shown.trim()).unwrap();
    assert_eq!(shown["status"], "discarded");
    assert_eq!(
        shown["discarded_reason"],
        "a test payment from the provider's dashboard"
    );
    assert!(shown["discarded_at"].is_string());
    let (ok, listed, _) = ingest_cli(&app, &["events", "list", "--status", "discarded", "--json"]);
    assert!(ok && listed.contains("evt_stray"), "{listed}");

    // An order with its payment id appears: nothing applies the event.
    app.insert_order(61, "pay_61", "pending").await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(status_of(&app, "evt_stray").await, "discarded");
    assert_eq!(app.order_status(61).await, "pending");
    let (ok, out, _) = ingest_cli(&app, &["events", "replay", "evt_stray"]);
    assert!(
        ok && out.starts_with("unchanged: evt_stray is discarded"),
        "{out}"
    );
    let resend: serde_json::Value = app.post(&body).await.json().await.unwrap();
    assert_eq!(
        resend, answer,
        "the provider's resend gets the answer it was given"
    );

    // An event that was applied is not discarded.
    let paid = event("evt_paid", "payment.succeeded", "pay_62");
    app.insert_order(62, "pay_62", "pending").await;
    assert_eq!(app.post(&paid).await.status(), 200);
    let (ok, _, err) = ingest_cli(&app, &["events", "discard", "evt_paid", "--reason", "oops"]);
    assert!(!ok, "an applied event is not discarded");
    assert!(err.contains("evt_paid is processed (order 62)"), "{err}");
    let (ok, _, err) = ingest_cli(&app, &["events", "discard", "evt_nowhere", "--reason", "x"]);
    assert!(!ok && err.contains("no event `evt_nowhere` recorded"), "{err}");
}
