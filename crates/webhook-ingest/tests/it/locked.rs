//! A row lock held on one order, by the shop or by a slow delivery, must not
//! stall anybody else: a redelivery of an event already processed is
//! answered without looking at its order, and deliveries that must wait for
//! the lock wait without holding a database connection, so the webhooks of
//! other orders are answered while the lock is still held. The waiting
//! deliveries keep their contract: a 200 when the lock clears within the
//! deadline (here), a 503 when it does not (cancel.rs).

use std::time::Duration;

use futures_util::future::join_all;

use crate::helpers::{
    SECRET, TestApp, WAITING_FOR_A_LOCK, event, hold_order_lock, now, post_to, spawn_app_with,
    standard_headers,
};

/// Generous: only bounds a hang.
const HANG: Duration = Duration::from_secs(30);

/// `webhook_order_lock_waits_total`, read from the admin port.
async fn lock_waits(app: &TestApp) -> f64 {
    app.metrics().await.get("webhook_order_lock_waits_total", &[])
}

/// Posts `body` and returns its status, whether it was a replay, and its
/// JSON `status`.
async fn deliver(app: &TestApp, body: String) -> (u16, bool, String) {
    deliver_to(&app.http, &app.url, &body).await
}

/// [`deliver`], from a task of its own.
async fn deliver_to(http: &reqwest::Client, url: &str, body: &str) -> (u16, bool, String) {
    let response = post_to(http, url, body, &standard_headers(SECRET, now(), body)).await;
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let v: serde_json::Value = response.json().await.unwrap_or_default();
    (status, replayed, v["status"].as_str().unwrap_or("").to_owned())
}

/// Before: a redelivery locked its order before finding its claim, so while
/// the shop held the lock every redelivery waited out the deadline on a
/// connection and was answered 503.
#[tokio::test]
async fn a_redelivery_is_answered_while_its_order_is_locked() {
    let app = spawn_app_with(&["--ingest-deadline-ms", "3000", "--database-pool-size", "2"]).await;
    app.insert_order(1, "pay_1", "pending").await;
    let body = event("evt_locked_1", "payment.succeeded", "pay_1");
    assert_eq!(
        deliver(&app, body.clone()).await,
        (200, false, "processed".into())
    );

    let blocker = hold_order_lock(&app.db.as_ref().unwrap().url, 1).await;
    let redeliveries = tokio::time::timeout(HANG, join_all((0..10).map(|_| deliver(&app, body.clone()))))
        .await
        .expect("the redeliveries were answered");
    for answer in &redeliveries {
        assert_eq!(
            answer,
            &(200, true, "processed".to_owned()),
            "a redelivery while the order is locked is replayed, not made to wait"
        );
    }
    blocker.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        app.count("SELECT deliveries::int8 FROM processed_events WHERE event_id = 'evt_locked_1'")
            .await,
        11,
        "every redelivery counted"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox").await,
        2,
        "no second effect"
    );
    assert_eq!(lock_waits(&app).await, 0.0, "no redelivery waited for the lock");
}

/// Eight distinct events of a locked order (more than the pool's
/// connections) wait for the lock; forty payments of other orders, sent
/// after them, must all be answered while the lock is still held and before
/// any of the eight is. Before: the eight held every connection, waiting on
/// the lock, and the others queued for a connection until the eight gave
/// up at their deadline. Then the lock clears within the eight's deadline,
/// and they are answered 200 with the domain's outcomes.
#[tokio::test]
async fn a_locked_order_ties_up_no_connection_that_other_orders_need() {
    let app = spawn_app_with(&["--ingest-deadline-ms", "8000", "--database-pool-size", "4"]).await;
    for id in 1..=41 {
        app.insert_order(id, &format!("pay_{id}"), "pending").await;
    }
    let blocker = hold_order_lock(&app.db.as_ref().unwrap().url, 1).await;

    let waiting: Vec<_> = (0..8)
        .map(|i| {
            let body = event(&format!("evt_wait_{i}"), "payment.succeeded", "pay_1");
            let app_url = app.url.clone();
            let http = app.http.clone();
            tokio::spawn(async move {
                let answer = deliver_to(&http, &app_url, &body).await;
                (answer, std::time::Instant::now())
            })
        })
        .collect();
    // The eight have reached the database, and found the lock.
    let started = std::time::Instant::now();
    while app.count(WAITING_FOR_A_LOCK).await == 0 {
        assert!(
            started.elapsed() < HANG,
            "the waiting deliveries never reached the lock"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let others = tokio::time::timeout(
        HANG,
        join_all((2..=41).map(|id| {
            deliver(
                &app,
                event(
                    &format!("evt_other_{id}"),
                    "payment.succeeded",
                    &format!("pay_{id}"),
                ),
            )
        })),
    )
    .await
    .expect("the other orders' payments were answered");
    let others_done = std::time::Instant::now();
    for (id, answer) in (2..=41).zip(&others) {
        assert_eq!(
            answer,
            &(200, false, "processed".to_owned()),
            "order {id}: another order's payment is processed while order 1 is locked"
        );
    }
    assert!(
        waiting.iter().all(|w| !w.is_finished()),
        "the waiting deliveries are still waiting for the lock"
    );
    assert_eq!(app.order_status(1).await, "pending");
    // Their tries are counted, as they go on waiting.
    let started = std::time::Instant::now();
    while lock_waits(&app).await < 8.0 {
        assert!(
            started.elapsed() < HANG,
            "the waiting deliveries' tries are counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    blocker.batch_execute("COMMIT").await.unwrap();
    let mut outcomes = Vec::new();
    for w in waiting {
        let ((status, replayed, outcome), answered) = w.await.unwrap();
        assert!(answered > others_done);
        assert_eq!(
            (status, replayed),
            (200, false),
            "the lock cleared within the deadline"
        );
        outcomes.push(outcome);
    }
    outcomes.sort();
    assert_eq!(
        outcomes,
        [vec!["already_paid".to_owned(); 7], vec!["processed".to_owned()]].concat(),
        "one payment ships the order, the seven others are already paid"
    );
    assert_eq!(app.order_status(1).await, "paid");
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE order_id = 1").await,
        2,
        "one shipment and one confirmation for order 1"
    );
}
