//! `/metrics` as an operator scrapes it: a delivery shed for want of
//! capacity is counted as `shed`, apart from the database's `unavailable`;
//! the build, process and pool metrics are served beside the ingest's own.

use std::time::Duration;

use testkit::metrics::Metrics;

use crate::helpers::{
    SECRET, TestApp, WAITING_FOR_A_LOCK, event, hold_order_lock, now, post_to, spawn_app_with,
    standard_headers,
};

async fn scrape(app: &TestApp) -> Metrics {
    app.metrics().await
}

/// One in-flight permit, held by a delivery waiting for its order's lock:
/// the next verified delivery is answered 503 at once, counted as `shed`
/// (before: `unavailable`, like a database outage, though the database was
/// fine and only capacity was short). Then the lock clears and the first is
/// processed.
#[tokio::test]
async fn a_delivery_shed_for_capacity_is_counted_as_shed() {
    let app = spawn_app_with(&[
        "--ingest-max-in-flight",
        "1",
        "--ingest-deadline-ms",
        "8000",
        "--database-pool-size",
        "2",
    ])
    .await;
    app.insert_order(1, "pay_1", "pending").await;
    app.insert_order(2, "pay_2", "pending").await;
    let blocker = hold_order_lock(&app.db.as_ref().unwrap().url, 1).await;

    let waiting = {
        let (http, url) = (app.http.clone(), app.url.clone());
        let body = event("evt_holds_the_permit", "payment.succeeded", "pay_1");
        tokio::spawn(async move {
            let headers = standard_headers(SECRET, now(), &body);
            post_to(&http, &url, &body, &headers).await.status().as_u16()
        })
    };
    let started = std::time::Instant::now();
    while app.count(WAITING_FOR_A_LOCK).await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the first delivery never reached the lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let shed = app.post(&event("evt_shed", "payment.succeeded", "pay_2")).await;
    assert_eq!(shed.status(), 503, "no permit left: shed at once");
    assert!(shed.headers().contains_key("retry-after"));

    let m = scrape(&app).await;
    assert_eq!(m.get("webhook_requests_total", &[("outcome", "shed")]), 1.0);
    assert_eq!(
        m.get("webhook_requests_total", &[("outcome", "unavailable")]),
        0.0,
        "shedding is not the database's unavailability"
    );

    blocker.batch_execute("COMMIT").await.unwrap();
    assert_eq!(waiting.await.unwrap(), 200, "the permit's holder is processed");
    assert_eq!(
        app.count("SELECT count(*) FROM processed_events").await,
        1,
        "the shed delivery wrote nothing"
    );
}

/// The build, the process and the pool, read when scraped.
#[tokio::test]
async fn build_process_and_pool_metrics_are_served() {
    let app = spawn_app_with(&["--database-pool-size", "3"]).await;
    app.insert_order(1, "pay_1", "pending").await;
    assert_eq!(
        app.post(&event("evt_1", "payment.succeeded", "pay_1"))
            .await
            .status(),
        200
    );
    let m = scrape(&app).await;

    let build: Vec<_> = m
        .samples
        .iter()
        .filter(|(name, _, _)| name == "webhook_ingest_build_info")
        .collect();
    assert_eq!(build.len(), 1, "one build: {build:?}");
    let (_, labels, value) = build[0];
    assert_eq!(*value, 1.0);
    assert!(
        labels.contains(&("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned())),
        "{labels:?}"
    );

    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(m.find(name, &[]).is_some_and(|v| v > 0.0), "{name} > 0");
    }

    assert_eq!(m.find("db_pool_max_connections", &[]), Some(3.0));
    assert_eq!(m.find("db_pool_waiters", &[]), Some(0.0));
    let idle = m.find("db_pool_connections", &[("state", "idle")]).unwrap();
    let in_use = m.find("db_pool_connections", &[("state", "in_use")]).unwrap();
    assert!(
        (1.0..=3.0).contains(&(idle + in_use)),
        "a delivery was recorded on a pooled connection, and at most the pool's size are open: {idle} + {in_use}"
    );
}
