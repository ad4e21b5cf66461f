//! The database down, slow, or not migrated: a clean 503 the provider
//! retries, nothing partial, and recovery without a restart.

use std::time::Duration;

use crate::helpers::{event, spawn_app_on, spawn_app_with};
use testkit::{PrivateCluster, TestDb};

#[tokio::test]
async fn a_database_outage_is_503_and_the_service_recovers_on_its_own() {
    let cluster = PrivateCluster::start().expect("a private cluster");
    let url = cluster.migrated_database("outage").await.unwrap();
    let app = spawn_app_on(&url, &["--ingest-deadline-ms", "2000"]).await;
    app.insert_order(1, "pay_1", "pending").await;
    app.insert_order(2, "pay_2", "pending").await;
    assert_eq!(
        app.post(&event("evt_before", "payment.succeeded", "pay_1"))
            .await
            .status(),
        200
    );
    assert_eq!(app.readyz().await.0, 200);

    cluster.stop().unwrap();
    let body = event("evt_during", "payment.succeeded", "pay_2");
    let r = app.post(&body).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(v["error"].is_string());
    let (status, reason) = app.readyz().await;
    assert_eq!(status, 503);
    assert!(reason.contains("database"), "{reason}");

    cluster.resume().unwrap();
    // The pool reconnects by itself; the provider's retry now succeeds.
    let mut last = 0;
    for _ in 0..50 {
        let r = app.post(&body).await;
        last = r.status().as_u16();
        if last == 200 {
            let v: serde_json::Value = r.json().await.unwrap();
            assert_eq!(v["status"], "processed");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last, 200, "the service recovers without a restart");
    assert_eq!(app.readyz().await.0, 200);
    let client = TestDb::connect_url(&url).await;
    let n: i64 = client
        .query_one("SELECT count(*) FROM outbox WHERE order_id = 2", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 2, "exactly one shipment and one confirmation after the outage");
}

/// A database too slow for the deadline: 503, and the statement is rolled
/// back rather than committed after the provider was told to retry.
#[tokio::test]
async fn a_slow_database_is_503_within_the_deadline_and_nothing_commits() {
    let app = spawn_app_with(&["--ingest-deadline-ms", "500"]).await;
    app.insert_order(1, "pay_1", "pending").await;
    // Another session holds the order's row lock: the ingest will wait on it.
    let blocker = app.db.as_ref().unwrap().client().await;
    blocker
        .batch_execute("BEGIN; SELECT * FROM orders WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();

    let body = event("evt_slow", "payment.succeeded", "pay_1");
    let started = std::time::Instant::now();
    let r = app.post(&body).await;
    let elapsed = started.elapsed();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    assert!(
        elapsed < Duration::from_secs(3),
        "answered at the deadline, not later: {elapsed:?}"
    );

    // Let the lock go: the abandoned statement must not commit now.
    tokio::time::sleep(Duration::from_millis(600)).await;
    blocker.batch_execute("COMMIT").await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(app.written().await, (0, 0), "nothing partial, nothing late");

    let r = app.post(&body).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("idempotent-replayed").is_none());
    assert_eq!(app.count("SELECT count(*) FROM outbox").await, 2);
}

#[tokio::test]
async fn an_unmigrated_database_is_unready_until_migrated() {
    let db = TestDb::empty().await;
    let app = spawn_app_on(&db.url, &[]).await;
    let (status, reason) = app.readyz().await;
    assert_eq!(status, 503);
    assert!(reason.contains("not migrated"), "{reason}");
    let health = app
        .http
        .get(format!("{}/healthz", app.admin_url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200, "liveness does not depend on the database");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_webhook-ingest"))
        .arg("migrate")
        .env("DATABASE_URL", &db.url)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(app.readyz().await.0, 200, "ready without a restart");
    app.insert_order(1, "pay_1", "pending").await;
    assert_eq!(
        app.post(&event("evt_1", "payment.succeeded", "pay_1"))
            .await
            .status(),
        200
    );
}

/// `migrate` run concurrently and repeatedly converges on one schema.
#[tokio::test]
async fn migrate_is_safe_concurrently_and_repeatedly() {
    let db = TestDb::empty().await;
    let runs: Vec<_> = (0..4)
        .map(|_| {
            std::process::Command::new(env!("CARGO_BIN_EXE_webhook-ingest"))
                .arg("migrate")
                .env("DATABASE_URL", &db.url)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for run in runs {
        let out = run.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let client = db.client().await;
    let applied: i64 = client
        .query_one("SELECT count(*) FROM refinery_schema_history", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(applied as i32, db::migrate::expected_version());
}

/// A database migrated before V1's comment was corrected (its history holds
/// the checksum of the text as first applied, taken from such a database)
/// migrates, and its history then holds the embedded text's; any other
/// difference is still refused.
#[tokio::test]
async fn a_database_migrated_before_v1s_comment_was_corrected_still_migrates() {
    const AS_FIRST_APPLIED: &str = "17846769336987815260";
    let db = TestDb::empty().await;
    let migrate = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_webhook-ingest"))
            .arg("migrate")
            .env("DATABASE_URL", &db.url)
            .output()
            .unwrap()
    };
    assert!(migrate().status.success());
    let client = db.client().await;
    let v1 = || async {
        client
            .query_one(
                "SELECT checksum FROM refinery_schema_history WHERE version = 1",
                &[],
            )
            .await
            .unwrap()
            .get::<_, String>(0)
    };
    let embedded = v1().await;
    assert_ne!(embedded, AS_FIRST_APPLIED);
    let set_v1 = |checksum: &'static str| {
        let client = &client;
        async move {
            client
                .execute(
                    "UPDATE refinery_schema_history SET checksum = $1 WHERE version = 1",
                    &[&checksum],
                )
                .await
                .unwrap()
        }
    };

    set_v1(AS_FIRST_APPLIED).await;
    let out = migrate();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(v1().await, embedded);

    set_v1("123").await;
    let out = migrate();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("different than filesystem"), "{stderr}");
    assert_eq!(v1().await, "123", "a checksum it does not know stays as it was");
}

/// Past INGEST_MAX_IN_FLIGHT, a request is answered 503 at once (load
/// shedding), and the one in flight still completes.
#[tokio::test]
async fn beyond_the_in_flight_limit_requests_are_shed_at_once() {
    let app = spawn_app_with(&["--ingest-max-in-flight", "1", "--ingest-deadline-ms", "3000"]).await;
    app.insert_order(1, "pay_1", "pending").await;
    app.insert_order(2, "pay_2", "pending").await;
    let blocker = app.db.as_ref().unwrap().client().await;
    blocker
        .batch_execute("BEGIN; SELECT * FROM orders WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();
    let slow = {
        let body = event("evt_held", "payment.succeeded", "pay_1");
        let headers = crate::helpers::standard_headers(crate::helpers::SECRET, crate::helpers::now(), &body);
        let (http, url) = (app.http.clone(), app.url.clone());
        tokio::spawn(async move {
            let mut req = http.post(format!("{url}/webhooks/payments")).body(body);
            for (k, v) in &headers {
                req = req.header(*k, v);
            }
            req.send().await.unwrap().status().as_u16()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    let shed = app.post(&event("evt_shed", "payment.succeeded", "pay_2")).await;
    assert_eq!(shed.status(), 503);
    assert!(shed.headers().contains_key("retry-after"));
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "shed at once, not queued"
    );
    blocker.batch_execute("COMMIT").await.unwrap();
    assert_eq!(slow.await.unwrap(), 200);
    assert_eq!(
        app.count("SELECT count(*) FROM processed_events").await,
        1,
        "the shed request wrote nothing"
    );
    let retried = app.post(&event("evt_shed", "payment.succeeded", "pay_2")).await;
    assert_eq!(retried.status(), 200, "its retry goes through");
}

/// With the database unreachable, `/readyz` says so in fixed words: no
/// host, port or server message reaches whoever reads the admin port.
#[tokio::test]
async fn readyz_with_the_database_down_names_no_detail() {
    let cluster = PrivateCluster::start().expect("a private cluster");
    let url = cluster.migrated_database("readyz").await.unwrap();
    let app = spawn_app_on(&url, &[]).await;
    assert_eq!(app.readyz().await.0, 200);
    cluster.stop().unwrap();
    let (status, body) = app.readyz().await;
    assert_eq!(status, 503);
    assert_eq!(body, "not ready: database unavailable\n");
    cluster.resume().unwrap();
}
