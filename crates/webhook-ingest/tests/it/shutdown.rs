//! Stopping (SIGTERM in production): no new requests, those in flight finish.

use std::time::Duration;

use crate::helpers::{event, spawn_app_with};

#[tokio::test]
async fn stopping_finishes_the_request_in_flight_then_refuses_new_ones() {
    let app = spawn_app_with(&["--ingest-deadline-ms", "4000"]).await;
    app.insert_order(1, "pay_1", "pending").await;
    // Hold the order's lock so the request is still in flight when we stop.
    let blocker = app.db.as_ref().unwrap().client().await;
    blocker
        .batch_execute("BEGIN; SELECT * FROM orders WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();

    let url = app.url.clone();
    let body = event("evt_inflight", "payment.succeeded", "pay_1");
    let headers = crate::helpers::standard_headers(crate::helpers::SECRET, crate::helpers::now(), &body);
    let http = app.http.clone();
    let in_flight = tokio::spawn(async move {
        let mut req = http.post(format!("{url}/webhooks/payments")).body(body);
        for (k, v) in &headers {
            req = req.header(*k, v);
        }
        req.send().await.map(|r| r.status().as_u16())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let url = app.url.clone();
    let http = app.http.clone();
    let stopping = tokio::spawn(app.stop());
    tokio::time::sleep(Duration::from_millis(300)).await;
    blocker.batch_execute("COMMIT").await.unwrap();

    assert_eq!(
        in_flight.await.unwrap().unwrap(),
        200,
        "the request in flight completes"
    );
    tokio::time::timeout(Duration::from_secs(10), stopping)
        .await
        .expect("stops promptly")
        .unwrap();
    let refused = http
        .post(format!("{url}/webhooks/payments"))
        .body("{}")
        .send()
        .await;
    assert!(refused.is_err(), "no new connections after the stop");
}
