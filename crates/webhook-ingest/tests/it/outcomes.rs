//! Each remaining row of the table of responses (docs/CONTRACT.md, section 3).

use crate::helpers::{SECRET, TestApp, event, now, spawn_app, standard_headers};

async fn post_json(app: &TestApp, body: &str) -> (u16, serde_json::Value) {
    let r = app.post(body).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

#[tokio::test]
async fn an_unknown_type_is_ignored_recorded_and_replayed() {
    let app = spawn_app().await;
    let body = r#"{"id":"evt_unknown","type":"customer.created","data":{"name":"x"},"livemode":false}"#;
    let (status, v) = post_json(&app, body).await;
    assert_eq!(status, 200);
    assert_eq!(v["status"], "ignored");
    assert_eq!(v["event_id"], "evt_unknown");
    assert_eq!(app.count("SELECT count(*) FROM outbox").await, 0);
    let stored: serde_json::Value = app
        .client
        .query_one(
            "SELECT payload FROM processed_events WHERE event_id = 'evt_unknown'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored["data"]["name"], "x", "the payload is kept");
    let again = app.post(body).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
}

#[tokio::test]
async fn an_unmatched_payment_is_recorded_with_its_payload_and_listable() {
    let app = spawn_app().await;
    let body = event("evt_nomatch", "payment.succeeded", "pay_nobody");
    let (status, v) = post_json(&app, &body).await;
    assert_eq!(status, 200);
    assert_eq!(v["status"], "unmatched");
    assert_eq!(app.count("SELECT count(*) FROM outbox").await, 0);
    // A payment event without a payment id cannot match either.
    let (status, v) = post_json(
        &app,
        r#"{"id":"evt_no_pay","type":"payment.succeeded","data":{}}"#,
    )
    .await;
    assert_eq!((status, v["status"].as_str()), (200, Some("unmatched")));

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_webhook-ingest"))
        .args(["events", "list", "--status", "unmatched", "--json"])
        .env("DATABASE_URL", &app.db.as_ref().unwrap().url)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is one JSON object"))
        .collect();
    assert_eq!(lines.len(), 2);
    let nomatch = lines.iter().find(|l| l["event_id"] == "evt_nomatch").unwrap();
    assert_eq!(nomatch["event_type"], "payment.succeeded");
    assert_eq!(nomatch["status"], "unmatched");
    assert_eq!(nomatch["payload"]["data"]["payment_id"], "pay_nobody");
    assert!(nomatch["processed_at"].as_str().is_some());

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_webhook-ingest"))
        .args(["events", "list", "--status", "processed", "--json"])
        .env("DATABASE_URL", &app.db.as_ref().unwrap().url)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(out.stdout.is_empty(), "no processed events yet");
}

#[tokio::test]
async fn a_second_event_for_a_paid_order_ships_nothing_more() {
    let app = spawn_app().await;
    app.insert_order(1, "pay_1", "pending").await;
    let (_, v) = post_json(&app, &event("evt_a", "payment.succeeded", "pay_1")).await;
    assert_eq!(v["status"], "processed");
    let (status, v) = post_json(&app, &event("evt_b", "payment.succeeded", "pay_1")).await;
    assert_eq!(status, 200);
    assert_eq!(v["status"], "already_paid");
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE kind = 'ship_order'")
            .await,
        1
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE kind = 'send_confirmation'")
            .await,
        1
    );
}

#[tokio::test]
async fn a_refund_refunds_notifies_once_and_cancels_the_unsent_shipment() {
    let app = spawn_app().await;
    app.insert_order(1, "pay_1", "pending").await;
    post_json(&app, &event("evt_pay", "payment.succeeded", "pay_1")).await;
    let (status, v) = post_json(&app, &event("evt_refund", "payment.refunded", "pay_1")).await;
    assert_eq!(status, 200);
    assert_eq!(v["status"], "refunded");
    assert_eq!(app.order_status(1).await, "refunded");
    let rows: Vec<(String, String)> = app
        .text_pairs("SELECT idempotency_key, status FROM outbox ORDER BY id")
        .await;
    assert_eq!(
        rows,
        [
            ("ship-1".to_owned(), "cancelled".to_owned()),
            ("conf-1".to_owned(), "pending".to_owned()),
            ("refund-1".to_owned(), "pending".to_owned()),
        ]
    );
    // A second refund event: refunded again, but no second notice.
    let (_, v) = post_json(&app, &event("evt_refund_2", "payment.refunded", "pay_1")).await;
    assert_eq!(v["status"], "refunded");
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE kind = 'send_refund_notice'")
            .await,
        1
    );
}

/// A shipment held by a relay (its call under way) is cancelled but keeps its
/// lease, so the holder can still record that THAT call shipped it; a
/// shipment already sent stays done.
#[tokio::test]
async fn a_refund_cancels_a_held_shipment_keeping_its_lease_and_leaves_a_sent_one() {
    let app = spawn_app().await;
    app.insert_order(1, "pay_1", "pending").await;
    app.insert_order(2, "pay_2", "pending").await;
    post_json(&app, &event("evt_p1", "payment.succeeded", "pay_1")).await;
    post_json(&app, &event("evt_p2", "payment.succeeded", "pay_2")).await;
    app.client
        .batch_execute(
            "UPDATE outbox SET lease_owner = 'relay-a', leased_until = now() + interval '1 minute',
                              attempts = 1, claims = 1
              WHERE idempotency_key = 'ship-1';
             UPDATE outbox SET status = 'done', finished_at = now() WHERE idempotency_key = 'ship-2';",
        )
        .await
        .unwrap();
    post_json(&app, &event("evt_r1", "payment.refunded", "pay_1")).await;
    post_json(&app, &event("evt_r2", "payment.refunded", "pay_2")).await;
    let rows: Vec<(String, String, Option<String>)> = app
        .client
        .query(
            "SELECT idempotency_key, status, lease_owner FROM outbox WHERE kind = 'ship_order' ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        rows,
        [
            ("ship-1".into(), "cancelled".into(), Some("relay-a".into())),
            ("ship-2".into(), "done".into(), None),
        ]
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE kind = 'send_refund_notice'")
            .await,
        2
    );
}

/// Retention removed a paid order's shipment row long after it was done; a
/// refund then writes the shipment's row as cancelled, saying why, so that
/// nothing could ever send one.
#[tokio::test]
async fn a_refund_after_retention_records_that_there_was_no_shipment_to_stop() {
    let app = spawn_app().await;
    app.insert_order(1, "pay_1", "paid").await;
    let (_, v) = post_json(&app, &event("evt_r", "payment.refunded", "pay_1")).await;
    assert_eq!(v["status"], "refunded");
    let row = app
        .client
        .query_one(
            "SELECT status, last_error FROM outbox WHERE idempotency_key = 'ship-1'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "cancelled");
    assert!(row.get::<_, String>(1).contains("no shipment to stop"));
}

#[tokio::test]
async fn a_refund_overtaking_the_payment_means_nothing_ships() {
    let app = spawn_app().await;
    app.insert_order(1, "pay_1", "pending").await;
    let (_, v) = post_json(&app, &event("evt_r", "payment.refunded", "pay_1")).await;
    assert_eq!(v["status"], "refunded");
    let (status, v) = post_json(&app, &event("evt_p", "payment.succeeded", "pay_1")).await;
    assert_eq!(status, 200);
    assert_eq!(v["status"], "order_refunded");
    assert_eq!(app.order_status(1).await, "refunded");
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE kind IN ('ship_order', 'send_confirmation')")
            .await,
        0
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE kind = 'send_refund_notice'")
            .await,
        1
    );
    let statuses: Vec<String> = app
        .client
        .query("SELECT status FROM processed_events ORDER BY processed_at", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(statuses, ["refunded", "order_refunded"]);
}

#[tokio::test]
async fn verified_but_not_an_event_is_400_and_writes_nothing() {
    let app = spawn_app().await;
    let long_id = "e".repeat(300);
    let long = format!(r#"{{"id":"{long_id}","type":"payment.succeeded"}}"#);
    for body in [
        "not json",
        "[]",
        r#"{"type":"payment.succeeded"}"#,
        r#"{"id":"evt_1"}"#,
        r#"{"id":17,"type":"payment.succeeded"}"#,
        r#"{"id":"evt_nul\u0000","type":"payment.succeeded"}"#,
        long.as_str(),
    ] {
        let r = app.post(body).await;
        assert_eq!(r.status(), 400, "{body}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert!(v["error"].is_string());
    }
    assert_eq!(app.written().await, (0, 0));
}

#[tokio::test]
async fn an_oversized_body_is_413_whatever_its_signature() {
    let app = spawn_app().await;
    let padding = "x".repeat(256 * 1024);
    let body = format!(r#"{{"id":"evt_big","type":"payment.succeeded","pad":"{padding}"}}"#);
    // Properly signed, and not signed at all.
    let r = app.post(&body).await;
    assert_eq!(r.status(), 413);
    let r = app.post_with(&body, &[]).await;
    assert_eq!(r.status(), 413);

    // Chunked, without Content-Length: the bytes read are counted.
    let headers = standard_headers(SECRET, now(), &body);
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = body
        .as_bytes()
        .chunks(16 * 1024)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let mut req = app
        .http
        .post(format!("{}/webhooks/payments", app.url))
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(chunks)));
    for (k, v) in &headers {
        req = req.header(*k, v);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(app.written().await, (0, 0));

    // Exactly at the limit is fine (and then just not an event we know).
    let pad = 256 * 1024 - r#"{"id":"evt_edge","type":"x","pad":""}"#.len();
    let edge = format!(r#"{{"id":"evt_edge","type":"x","pad":"{}"}}"#, "y".repeat(pad));
    assert_eq!(edge.len(), 256 * 1024);
    let r = app.post(&edge).await;
    assert_eq!(r.status(), 200);
}
