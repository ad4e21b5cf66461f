//! Stopping (SIGTERM in production): no new requests, those in flight finish.
//!
//! Ordered by what the test observes, never by sleeping: the request is known
//! to be in flight when its statement waits on a lock the test holds, and the
//! stop is known to have begun when the listener refuses connections. Only
//! then is the lock released.

use std::time::Duration;

use crate::helpers::{event, spawn_app_with};

/// How often the test looks again; only the pace of its polling.
const POLL_EVERY: Duration = Duration::from_millis(20);

#[tokio::test]
async fn stopping_finishes_the_request_in_flight_then_refuses_new_ones() {
    let app = spawn_app_with(&["--ingest-deadline-ms", "60000"]).await;
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
    // In flight: the ingest's statement waits for the order's lock.
    testkit::wait_for_count(
        &app.client,
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = 'webhook-ingest'
            AND wait_event_type = 'Lock'",
        1,
        Duration::from_secs(60),
    )
    .await;

    let address = app.url.trim_start_matches("http://").to_owned();
    let stopping = tokio::spawn(app.stop());
    // Stopping: the listener is closed, a new connection is refused.
    while tokio::net::TcpStream::connect(&address).await.is_ok() {
        tokio::time::sleep(POLL_EVERY).await;
    }
    assert!(
        !stopping.is_finished(),
        "the stop waits for the request in flight"
    );
    blocker.batch_execute("COMMIT").await.unwrap();

    assert_eq!(
        in_flight.await.unwrap().unwrap(),
        200,
        "the request in flight completes"
    );
    stopping.await.unwrap();
    assert!(
        tokio::net::TcpStream::connect(&address).await.is_err(),
        "no new connections after the stop"
    );
}
