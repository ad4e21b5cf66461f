//! A fresh database, a simulated downstream, and relays: in process (for
//! `relay_once`) or as real processes (for signals). Relays log in as a
//! member of the `outbox_relay` role; the test's own connection (`client`)
//! is the cluster's superuser.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser as _;
use outbox_relay::config::Cli;
use outbox_relay::metrics::RelayMetrics;
use outbox_relay::worker::Relay;
use simulator::downstream::{DownstreamConfig, RunningDownstream, Stats};
use testkit::{Role, TestDb};

pub const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

pub struct Env {
    pub db: TestDb,
    /// The database as the relay (and its operator commands) log in to it.
    pub relay_url: String,
    pub client: tokio_postgres::Client,
    pub downstream: RunningDownstream,
    pub http: reqwest::Client,
}

pub async fn env() -> Env {
    env_with(DownstreamConfig::default()).await
}

pub async fn env_with(config: DownstreamConfig) -> Env {
    if std::env::var_os("TEST_LOG").is_some() {
        process::logs::init(process::LogFormat::Pretty);
    }
    let db = TestDb::new().await;
    let client = db.client().await;
    let downstream = simulator::downstream::spawn(config)
        .await
        .expect("starting the downstream");
    Env {
        relay_url: db.url_as(Role::Relay),
        db,
        client,
        downstream,
        http: testkit::http(),
    }
}

impl Env {
    pub fn url(&self) -> String {
        self.downstream.url()
    }

    /// Relay flags for this environment, plus `extra`.
    pub fn cli(&self, extra: &[&str]) -> Cli {
        let url = self.url();
        let mut args = vec![
            "outbox-relay",
            "--database-url",
            &self.relay_url,
            "--fulfilment-url",
            &url,
            "--email-url",
            &url,
            "--admin-listen-addr",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        Cli::try_parse_from(args).expect("valid relay flags")
    }

    /// An in-process relay for `relay_once`.
    pub fn relay(&self, extra: &[&str]) -> Relay {
        let settings = self.cli(extra).settings;
        let database = settings.database().unwrap();
        let pool = database.pool(&db::ConnectOptions {
            application_name: "outbox-relay-test",
            statement_timeout: None,
            lock_timeout: None,
            abort_when_client_leaves: false,
            asynchronous_commit: true,
            generic_plans: false,
            index_paths: false,
            pool_size: 4,
            pool_wait: Duration::from_secs(5),
        });
        let mut registry = prometheus_client::registry::Registry::default();
        Relay::new(
            pool,
            database.span_server(),
            settings.relay().unwrap(),
            RelayMetrics::register(&mut registry),
        )
        .unwrap()
    }

    /// Enqueues a command and notifies the relays, in one statement (the ingest
    /// notifies after its commit, in a statement of its own: `notifier.rs`).
    pub async fn enqueue(&self, kind: &str, order_id: i64, event_id: &str) -> i64 {
        let prefix = domain::CommandKind::parse(kind).map_or("x", |k| k.key_prefix());
        let row = self
            .client
            .query_one(
                "WITH r AS (
                   INSERT INTO outbox (kind, payload, idempotency_key, event_id, order_id, trace_context)
                   VALUES ($1, jsonb_build_object('v', 1, 'order_id', $2::int8, 'event_id', $3::text),
                           $4 || '-' || $2::int8, $3, $2, $5)
                   RETURNING id)
                 SELECT r.id, (SELECT count(pg_notify($6, ''))) AS notified FROM r",
                &[
                    &kind,
                    &order_id,
                    &event_id,
                    &prefix,
                    &TRACEPARENT,
                    &db::NOTIFY_CHANNEL,
                ],
            )
            .await
            .unwrap();
        row.get("id")
    }

    /// `n` ship_order rows for orders `first..first+n`, in one statement.
    pub async fn seed(&self, first: i64, n: i64) {
        self.client
            .execute(
                "INSERT INTO outbox (kind, payload, idempotency_key, event_id, order_id, trace_context)
                 SELECT 'ship_order', jsonb_build_object('v', 1, 'order_id', o, 'event_id', 'evt_' || o),
                        'ship-' || o, 'evt_' || o, o, $3
                   FROM generate_series($1::int8, $1::int8 + $2::int8 - 1) AS o",
                &[&first, &n, &TRACEPARENT],
            )
            .await
            .unwrap();
    }

    pub async fn count(&self, sql: &str) -> i64 {
        testkit::count(&self.client, sql).await
    }

    pub async fn row_status(&self, id: i64) -> (String, i32, Option<String>) {
        let r = self
            .client
            .query_one(
                "SELECT status, attempts, last_error FROM outbox WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        (r.get("status"), r.get("attempts"), r.get("last_error"))
    }

    pub async fn stats(&self) -> Stats {
        self.downstream.stats()
    }

    /// The downstream's latency for every call (`"1500"`, `"0..30"`, ...):
    /// long enough for calls to be in flight when a test acts.
    pub async fn set_latency(&self, latency: &str) {
        let r = self
            .http
            .post(format!("{}/control/faults", self.url()))
            .json(&serde_json::json!({ "latency_ms": latency }))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "setting latency: {}", r.status());
    }

    /// Scripted answers for one key, e.g. `[500, 500, 200]`.
    pub async fn script(&self, key: &str, responses: serde_json::Value) {
        let r = self
            .http
            .post(format!("{}/control/script", self.url()))
            .json(&serde_json::json!({"key": key, "responses": responses}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "scripting {key}: {}", r.status());
    }

    /// A relay process with this environment's settings and `env` on top.
    pub fn spawn_relay(&self, env: &[(&str, &str)]) -> RelayProcess {
        let url = self.url();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
        cmd.env("DATABASE_URL", &self.relay_url)
            .env("FULFILMENT_URL", &url)
            .env("EMAIL_URL", &url)
            .env("ADMIN_LISTEN_ADDR", "127.0.0.1:0")
            .env("LOG_FORMAT", "json")
            .env("RUST_LOG", "warn,outbox_relay=info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        RelayProcess(cmd.spawn().expect("spawning outbox-relay"))
    }

    /// Waits until `sql` (a count) reaches `target`, or panics after `timeout`.
    pub async fn wait_for(&self, sql: &str, target: i64, timeout: Duration) {
        testkit::wait_for_count(&self.client, sql, target, timeout).await;
    }
}

pub struct RelayProcess(pub Child);

impl RelayProcess {
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the exit, up to `timeout`; returns the exit code and stderr.
    pub fn wait(mut self, timeout: Duration) -> (Option<i32>, String) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut stderr) = self.0.stderr.take() {
                    use std::io::Read as _;
                    let _ = stderr.read_to_string(&mut err);
                }
                return (status.code(), err);
            }
            assert!(
                started.elapsed() < timeout,
                "the relay did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
