//! A 503 for the deadline cancels the record statement on the server. The
//! abandoned statement waits on the order's row lock, held by another
//! session; once the lock goes, an uncancelled statement would commit the
//! event the provider was told to retry. Nothing may be written, and the
//! provider's retry processes the event as if it were the first delivery.

use std::path::Path;
use std::time::Duration;

use futures_util::StreamExt as _;
use testkit::{PrivateCluster, Role};

use crate::helpers::{
    SECRET, TestApp, WAITING_FOR_A_LOCK, event, hold_order_lock, now, spawn_app_on, spawn_app_with,
    standard_headers,
};

/// Generous: only bounds a hang. A cancelled statement ends in milliseconds.
const HANG: Duration = Duration::from_secs(15);

/// Ingest sessions of the test's database still running the record statement.
const RECORDING: &str = "SELECT count(*) FROM pg_stat_activity
    WHERE datname = current_database() AND usename = 'webhook_test_ingest'
      AND state = 'active' AND query LIKE '%INSERT INTO public.processed_events%'";

async fn assert_503_with_retry_after(response: reqwest::Response) {
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
}

/// Nothing written for the abandoned delivery; then its retry is processed.
async fn assert_not_processed_until_retried(app: &TestApp, body: &str) {
    testkit::wait_for_count(&app.client, RECORDING, 0, HANG).await;
    assert_eq!(app.written().await, (0, 0), "no claim, no outbox rows");
    assert_eq!(app.order_status(1).await, "pending");

    let retry = app.post(body).await;
    assert_eq!(retry.status(), 200);
    assert!(
        retry.headers().get("idempotent-replayed").is_none(),
        "the retry is the delivery that processes the event"
    );
    let v: serde_json::Value = retry.json().await.unwrap();
    assert_eq!(v["status"], "processed");
    assert_eq!(
        app.written().await,
        (1, 2),
        "one claim, a shipment and a confirmation"
    );
    assert_eq!(app.order_status(1).await, "paid");
}

/// Session mode, as deployed by default. The body arrives in two parts, the
/// second well into the deadline, so the statement starts late and the
/// server's `statement_timeout` (counted from the statement's start) would
/// still let it wait when the 503 goes out; a discarded connection is noticed
/// only at the server's next 250 ms poll. The lock is released right after
/// the 503: only a cancel that took effect before it keeps the event out.
#[tokio::test]
async fn a_503_for_the_deadline_cancels_the_statement_and_the_retry_processes_the_event() {
    let app = spawn_app_with(&["--ingest-deadline-ms", "1000"]).await;
    app.insert_order(1, "pay_1", "pending").await;
    let db_url = app.db.as_ref().unwrap().url.clone();
    let blocker = hold_order_lock(&db_url, 1).await;

    let body = event("evt_abandoned", "payment.succeeded", "pay_1");
    let (first, second) = body.split_at(body.len() / 2);
    let parts = [first.to_owned(), second.to_owned()];
    let slow_body = futures_util::stream::iter(parts.into_iter().enumerate()).then(|(i, part)| async move {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        Ok::<_, std::io::Error>(part)
    });
    let mut request = app
        .http
        .post(format!("{}/webhooks/payments", app.url))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(slow_body));
    for (k, v) in standard_headers(SECRET, now(), &body) {
        request = request.header(k, v);
    }
    assert_503_with_retry_after(request.send().await.unwrap()).await;

    // The provider was told to retry: from here an uncancelled statement
    // would take the lock and commit.
    blocker.batch_execute("COMMIT").await.unwrap();
    assert_not_processed_until_retried(&app, &body).await;
}

/// Over TLS (`sslmode=require`: the cancel request is encrypted like the
/// pool's connections), through the transaction-mode path, and with no
/// server-side backstop at all: nothing but the cancel can end the statement.
#[tokio::test]
async fn over_tls_with_no_server_backstop_only_the_cancel_ends_the_statement() {
    let dir = std::env::temp_dir().join(format!("ingest-cancel-tls-{}", testkit::free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = self_signed_certificate(&dir);
    let cluster = PrivateCluster::start_with_tls(&cert, &key).expect("a TLS cluster");
    let url = format!(
        "{}?sslmode=require",
        cluster.migrated_database("shop").await.unwrap()
    );
    // Before the app's first connection: the role's own backstops go for
    // this database (the timeout, and the polling for a closed connection,
    // which a discarded connection would otherwise trip within 250 ms).
    testkit::login_url(&url, Role::Ingest).await;
    testkit::TestDb::connect_url(&url)
        .await
        .batch_execute(&format!(
            "ALTER ROLE {login} IN DATABASE shop SET statement_timeout = 0;
             ALTER ROLE {login} IN DATABASE shop SET client_connection_check_interval = 0;
             ALTER ROLE {login} IN DATABASE shop SET lock_timeout = 0",
            login = Role::Ingest.login()
        ))
        .await
        .unwrap();
    let app = spawn_app_on(
        &url,
        &[
            "--ingest-deadline-ms",
            "500",
            "--database-pool-mode",
            "transaction",
        ],
    )
    .await;
    app.insert_order(1, "pay_1", "pending").await;
    let blocker = hold_order_lock(&url, 1).await;

    let body = event("evt_abandoned", "payment.succeeded", "pay_1");
    assert_503_with_retry_after(app.post(&body).await).await;
    // Without the cancel the statement would wait on the lock for ever.
    testkit::wait_for_count(&app.client, WAITING_FOR_A_LOCK, 0, HANG).await;
    blocker.batch_execute("COMMIT").await.unwrap();
    assert_not_processed_until_retried(&app, &body).await;
    let sessions = app
        .client
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE ssl) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid)
              WHERE datname = current_database() AND usename = $1",
            &[&Role::Ingest.login()],
        )
        .await
        .unwrap();
    let (all, encrypted): (i64, i64) = (sessions.get(0), sessions.get(1));
    assert!(
        all > 0 && encrypted == all,
        "the ingest's sessions use TLS: {encrypted} of {all}"
    );
    drop(app);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A certificate for `localhost` and its key (PEM), enough for `sslmode=require`.
fn self_signed_certificate(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
    let out = std::process::Command::new("openssl")
        .args(["req", "-x509", "-nodes", "-days", "1", "-subj", "/CN=localhost"])
        .args(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("running openssl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (cert, key)
}
