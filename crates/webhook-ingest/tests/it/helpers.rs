//! `spawn_app()`: the real application on port 0 against a fresh database,
//! logged in as a member of the `webhook_ingest` role, so every test also
//! proves the role's grants suffice. The test's own connection (`client`:
//! set-up and inspection) is the cluster's superuser.

use clap::Parser as _;
use testkit::TestDb;
pub use testkit::webhook::{SECRET, event, now, standard_headers};
use tokio_util::sync::CancellationToken;
use webhook_ingest::config::Cli;
use webhook_ingest::http::WEBHOOK_PATH;
use webhook_ingest::startup::Application;

pub const OTHER_SECRET: &str = "whsec_QUJDREVGR0hJSktMTU5PUA==";
pub const STRIPE_SECRET: &str = "sk_test_stripe_style_secret";

pub struct TestApp {
    pub url: String,
    pub admin_url: String,
    pub http: reqwest::Client,
    pub db: Option<TestDb>,
    pub client: tokio_postgres::Client,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

pub fn init_test_logs() {
    if std::env::var_os("TEST_LOG").is_some() {
        process::logs::init(process::LogFormat::Pretty);
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(&[]).await
}

/// The app with extra flags (`--webhook-signature-scheme stripe`, ...).
pub async fn spawn_app_with(extra: &[&str]) -> TestApp {
    let db = TestDb::new().await;
    let url = db.url.clone();
    let mut app = spawn_app_on(&url, extra).await;
    app.db = Some(db);
    app
}

/// The app against a given database (a private cluster, an unmigrated
/// database): `database_url` is a superuser's; the app logs in as the
/// ingest's test user of that cluster.
pub async fn spawn_app_on(database_url: &str, extra: &[&str]) -> TestApp {
    init_test_logs();
    let app_url = testkit::login_url(database_url, testkit::Role::Ingest).await;
    let mut args = vec!["webhook-ingest", "--database-url", &app_url];
    if !extra.contains(&"--webhook-secrets") {
        args.extend_from_slice(&["--webhook-secrets", SECRET]);
    }
    args.extend_from_slice(&[
        "--ingest-listen-addr",
        "127.0.0.1:0",
        "--admin-listen-addr",
        "127.0.0.1:0",
    ]);
    args.extend_from_slice(extra);
    let cli = Cli::try_parse_from(args).expect("valid test flags");
    let settings = cli.settings;
    let database = settings.database().unwrap();
    let app =
        Application::build(&settings, &database, settings.verifier().unwrap()).expect("building the app");
    let url = format!("http://127.0.0.1:{}", app.port());
    let admin_url = format!("http://127.0.0.1:{}", app.admin_port());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(app.run_until_stopped(shutdown.clone()));
    let client = TestDb::connect_url(database_url).await;
    TestApp {
        url,
        admin_url,
        http: testkit::http(),
        db: None,
        client,
        shutdown,
        task: Some(task),
    }
}

/// Posts `body` to the ingest at `url` with `headers`: [`TestApp::post_with`]
/// for a task that holds only the client and the URL.
pub async fn post_to(
    http: &reqwest::Client,
    url: &str,
    body: &str,
    headers: &[(&'static str, String)],
) -> reqwest::Response {
    testkit::webhook::post(http, &format!("{url}{WEBHOOK_PATH}"), body, headers)
        .await
        .expect("request sent")
}

/// The ingest's sessions of the test's database waiting for a lock.
pub const WAITING_FOR_A_LOCK: &str = "SELECT count(*) FROM pg_stat_activity
    WHERE datname = current_database() AND usename = 'webhook_test_ingest'
      AND wait_event_type = 'Lock'";

/// Holds order `id`'s row lock in a transaction of its own on the database
/// at `url`, as a shop's transaction (or a concurrent event) would; the lock
/// goes with the transaction's end.
pub async fn hold_order_lock(url: &str, id: i64) -> tokio_postgres::Client {
    let blocker = TestDb::connect_url(url).await;
    blocker
        .batch_execute(&format!("BEGIN; SELECT * FROM orders WHERE id = {id} FOR UPDATE"))
        .await
        .unwrap();
    blocker
}

/// A transaction of the test's own holding `event_id`'s row locked (FOR
/// UPDATE) until the caller commits it.
pub async fn hold_event_row(app: &TestApp, event_id: &str) -> tokio_postgres::Client {
    let holder = TestDb::connect_url(&app.db.as_ref().unwrap().url).await;
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .execute(
            "SELECT 1 FROM processed_events WHERE event_id = $1 FOR UPDATE",
            &[&event_id],
        )
        .await
        .unwrap();
    holder
}

impl TestApp {
    /// The first two (text) columns of every row `sql` returns.
    pub async fn text_pairs(&self, sql: &str) -> Vec<(String, String)> {
        self.client
            .query(sql, &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    /// Posts `body` signed as a provider would, now.
    pub async fn post(&self, body: &str) -> reqwest::Response {
        self.post_with(body, &standard_headers(SECRET, now(), body)).await
    }

    pub async fn post_with(&self, body: &str, headers: &[(&'static str, String)]) -> reqwest::Response {
        post_to(&self.http, &self.url, body, headers).await
    }

    pub async fn insert_order(&self, id: i64, payment_id: &str, status: &str) {
        testkit::insert_order(&self.client, id, payment_id, status).await;
    }

    pub async fn count(&self, sql: &str) -> i64 {
        testkit::count(&self.client, sql).await
    }

    pub async fn order_status(&self, id: i64) -> String {
        self.client
            .query_one("SELECT status FROM orders WHERE id = $1", &[&id])
            .await
            .unwrap()
            .get(0)
    }

    /// Rows written by the ingest, in every table it writes.
    pub async fn written(&self) -> (i64, i64) {
        (
            self.count("SELECT count(*) FROM processed_events").await,
            self.count("SELECT count(*) FROM outbox").await,
        )
    }

    /// `/metrics` of the admin port, parsed.
    pub async fn metrics(&self) -> testkit::metrics::Metrics {
        testkit::metrics::Metrics::fetch(&self.http, &self.admin_url)
            .await
            .unwrap()
    }

    pub async fn readyz(&self) -> (u16, String) {
        let r = self
            .http
            .get(format!("{}/readyz", self.admin_url))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
