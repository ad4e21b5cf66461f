//! The stack as a user runs it: `webhook-ingest` and `outbox-relay` as
//! processes (their stdout captured), the simulated downstream, a fresh
//! database, and optionally an OTLP/HTTP receiver that decodes what the
//! services export. The services log in as members of their own database
//! roles (least privilege); the test's `client` is the cluster's superuser.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{App, HttpResponse, HttpServer, web};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;
use simulator::downstream::{DownstreamConfig, RunningDownstream};
pub use testkit::metrics::Metrics;
use testkit::{Role, TestDb};
use webhook_ingest::http::WEBHOOK_PATH;

pub use testkit::{SECRET, event};

/// How a test's relays retry against a faulty downstream: short leases, so
/// a killed relay's rows come back within the test, and fast backoff.
pub struct RelayTuning {
    pub lease_secs: u64,
    pub http_timeout_ms: u64,
    pub backoff_base_ms: u64,
    pub backoff_max_secs: u64,
    pub poll_interval_ms: u64,
}

impl RelayTuning {
    /// A relay's environment: the database, one downstream for both APIs, an
    /// admin port of its own, JSON logs of warnings only, and this tuning.
    pub fn env(&self, url: &str, downstream: &str) -> Vec<(String, String)> {
        [
            ("DATABASE_URL", url.to_owned()),
            ("FULFILMENT_URL", downstream.to_owned()),
            ("EMAIL_URL", downstream.to_owned()),
            ("ADMIN_LISTEN_ADDR", "127.0.0.1:0".to_owned()),
            ("RELAY_LEASE_SECS", self.lease_secs.to_string()),
            ("RELAY_HTTP_TIMEOUT_MS", self.http_timeout_ms.to_string()),
            ("RELAY_BACKOFF_BASE_MS", self.backoff_base_ms.to_string()),
            ("RELAY_BACKOFF_MAX_SECS", self.backoff_max_secs.to_string()),
            ("RELAY_POLL_INTERVAL_MS", self.poll_interval_ms.to_string()),
            ("LOG_FORMAT", "json".to_owned()),
            ("RUST_LOG", "warn".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

/// A real process with its stdout in a file, killed on drop.
pub struct Proc {
    pub child: Child,
    pub stdout: PathBuf,
    pub name: &'static str,
}

impl Proc {
    pub fn spawn(name: &'static str, env: &[(String, String)], dir: &std::path::Path) -> Self {
        Self::spawn_with_args(name, &[], env, dir)
    }

    pub fn spawn_with_args(
        name: &'static str,
        args: &[&str],
        env: &[(String, String)],
        dir: &std::path::Path,
    ) -> Self {
        let stdout = dir.join(format!("{name}-{}.log", testkit::free_port()));
        let file = std::fs::File::create(&stdout).unwrap();
        let mut cmd = Command::new(testkit::bin::path(name));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdout(Stdio::from(file))
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self {
            child: cmd.spawn().unwrap_or_else(|e| panic!("spawning {name}: {e}")),
            stdout,
            name,
        }
    }

    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{signal} {}", self.name);
    }

    /// SIGTERM and wait for exit 0.
    pub fn stop(&mut self, timeout: Duration) {
        self.signal("TERM");
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert_eq!(status.code(), Some(0), "{} exit status", self.name);
                return;
            }
            assert!(
                started.elapsed() < timeout,
                "{} did not stop within {timeout:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stdout);
    }
}

/// One span as the receiver decoded it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    /// 1 internal, 2 server, 3 client, 4 producer, 5 consumer.
    pub kind: i32,
    /// 0 unset, 1 ok, 2 error.
    pub status: i32,
    /// Every attribute, as text whatever its type.
    pub attributes: HashMap<String, String>,
    /// The attributes exported as integers.
    pub ints: HashMap<String, i64>,
    /// Its resource's attributes (`service.name`, `service.version`...).
    pub resource: HashMap<String, String>,
}

impl ReceivedSpan {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }

    /// An attribute exported as an integer (`None` if absent or of another type).
    pub fn int(&self, key: &str) -> Option<i64> {
        self.ints.get(key).copied()
    }
}

/// An OTLP/HTTP (protobuf) trace receiver on loopback.
pub struct OtlpReceiver {
    pub url: String,
    pub spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    handle: actix_web::dev::ServerHandle,
}

impl OtlpReceiver {
    pub async fn start() -> Self {
        let spans: Arc<Mutex<Vec<ReceivedSpan>>> = Arc::default();
        let store = web::Data::new(spans.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(store.clone())
                .app_data(web::PayloadConfig::new(64 * 1024 * 1024))
                .route("/v1/traces", web::post().to(receive))
        })
        .workers(1)
        .disable_signals()
        .bind("127.0.0.1:0")
        .unwrap();
        let port = server.addrs()[0].port();
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);
        Self {
            url: format!("http://127.0.0.1:{port}"),
            spans,
            handle,
        }
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        let handle = self.handle.clone();
        tokio::spawn(async move { handle.stop(false).await });
    }
}

async fn receive(body: web::Bytes, store: web::Data<Arc<Mutex<Vec<ReceivedSpan>>>>) -> HttpResponse {
    let Ok(request) = ExportTraceServiceRequest::decode(body.as_ref()) else {
        return HttpResponse::BadRequest().finish();
    };
    let mut spans = store.lock().unwrap();
    for resource_spans in request.resource_spans {
        let resource: HashMap<String, String> = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .map(|a| (a.key.clone(), value_string(a.value.as_ref())))
            .collect();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                spans.push(ReceivedSpan {
                    service: service.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    kind: span.kind,
                    status: span.status.map_or(0, |s| s.code),
                    attributes: span
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), value_string(a.value.as_ref())))
                        .collect(),
                    ints: span
                        .attributes
                        .iter()
                        .filter_map(|a| match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                            Some(opentelemetry_proto::tonic::common::v1::any_value::Value::IntValue(i)) => {
                                Some((a.key.clone(), *i))
                            }
                            _ => None,
                        })
                        .collect(),
                    resource: resource.clone(),
                });
            }
        }
    }
    HttpResponse::Ok().content_type("application/x-protobuf").finish()
}

fn value_string(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub struct Stack {
    /// Kept for its lifetime: the database is dropped with the stack.
    pub _db: TestDb,
    pub client: tokio_postgres::Client,
    pub downstream: RunningDownstream,
    pub otlp: Option<OtlpReceiver>,
    pub ingest: Proc,
    pub relay: Proc,
    pub ingest_url: String,
    pub ingest_admin: String,
    pub relay_admin: String,
    pub http: reqwest::Client,
    _dir: TempDir,
}

pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[derive(Default)]
pub struct StackOptions {
    pub otlp: bool,
    pub relay_env: Vec<(&'static str, String)>,
    pub ingest_env: Vec<(&'static str, String)>,
    /// Both services reach the database through a transaction-mode pooler
    /// listening on this port of 127.0.0.1 (`DATABASE_POOL_MODE=transaction`);
    /// the relay keeps its LISTEN on a direct connection.
    pub through_pooler: Option<u16>,
}

impl Stack {
    pub async fn start(options: StackOptions) -> Self {
        let db = TestDb::new().await;
        let client = db.client().await;
        let downstream = simulator::downstream::spawn(DownstreamConfig::default())
            .await
            .unwrap();
        let otlp = if options.otlp {
            Some(OtlpReceiver::start().await)
        } else {
            None
        };
        let dir = std::env::temp_dir().join(format!("e2e-{}-{}", std::process::id(), testkit::free_port()));
        std::fs::create_dir_all(&dir).unwrap();

        let (ingest_port, ingest_admin_port, relay_admin_port) =
            (testkit::free_port(), testkit::free_port(), testkit::free_port());
        let mut common = vec![
            ("LOG_FORMAT".to_owned(), "json".to_owned()),
            ("RUST_LOG".to_owned(), "info".to_owned()),
        ];
        if let Some(otlp) = &otlp {
            common.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), otlp.url.clone()));
            // Export promptly; shutdown flushes the rest.
            common.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()));
        }
        let service_url = |role: Role| match options.through_pooler {
            Some(port) => testkit::url_with_port(&db.url_as(role), port),
            None => db.url_as(role),
        };
        if options.through_pooler.is_some() {
            common.push(("DATABASE_POOL_MODE".into(), "transaction".into()));
        }
        let mut ingest_env = common.clone();
        ingest_env.extend([
            ("DATABASE_URL".to_owned(), service_url(Role::Ingest)),
            ("WEBHOOK_SECRETS".to_owned(), SECRET.to_owned()),
            (
                "INGEST_LISTEN_ADDR".to_owned(),
                format!("127.0.0.1:{ingest_port}"),
            ),
            (
                "ADMIN_LISTEN_ADDR".to_owned(),
                format!("127.0.0.1:{ingest_admin_port}"),
            ),
        ]);
        ingest_env.extend(
            options
                .ingest_env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone())),
        );
        let mut relay_env = common;
        if options.through_pooler.is_some() {
            relay_env.push(("RELAY_LISTEN_DATABASE_URL".into(), db.url_as(Role::Relay)));
        }
        relay_env.extend([
            ("DATABASE_URL".to_owned(), service_url(Role::Relay)),
            ("FULFILMENT_URL".to_owned(), downstream.url()),
            ("EMAIL_URL".to_owned(), downstream.url()),
            (
                "ADMIN_LISTEN_ADDR".to_owned(),
                format!("127.0.0.1:{relay_admin_port}"),
            ),
            ("RELAY_BACKOFF_BASE_MS".to_owned(), "50".to_owned()),
            ("RELAY_POLL_INTERVAL_MS".to_owned(), "200".to_owned()),
        ]);
        relay_env.extend(
            options
                .relay_env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone())),
        );

        let ingest = Proc::spawn("webhook-ingest", &ingest_env, &dir);
        let relay = Proc::spawn("outbox-relay", &relay_env, &dir);
        let stack = Self {
            _db: db,
            client,
            downstream,
            otlp,
            ingest,
            relay,
            ingest_url: format!("http://127.0.0.1:{ingest_port}"),
            ingest_admin: format!("http://127.0.0.1:{ingest_admin_port}"),
            relay_admin: format!("http://127.0.0.1:{relay_admin_port}"),
            http: testkit::http(),
            _dir: TempDir(dir),
        };
        stack.wait_ready(&stack.ingest_admin).await;
        stack.wait_ready(&stack.relay_admin).await;
        stack
    }

    async fn wait_ready(&self, admin: &str) {
        wait_ready(&self.http, admin).await;
    }

    pub async fn insert_order(&self, id: i64, payment_id: &str) {
        testkit::insert_order(&self.client, id, payment_id, "pending").await;
    }

    /// Posts `body` signed now, with extra headers.
    pub async fn post(&self, body: &str, extra: &[(&str, &str)]) -> reqwest::Response {
        self.post_signed_with(body, SECRET, extra).await
    }

    pub async fn post_signed_with(
        &self,
        body: &str,
        secret: &str,
        extra: &[(&str, &str)],
    ) -> reqwest::Response {
        post_signed(&self.http, &self.ingest_url, body, secret, extra).await
    }

    pub async fn count(&self, sql: &str) -> i64 {
        testkit::count(&self.client, sql).await
    }

    pub async fn wait_for(&self, sql: &str, target: i64, timeout: Duration) {
        testkit::wait_for_count(&self.client, sql, target, timeout).await;
    }

    pub async fn metrics(&self, admin: &str) -> Metrics {
        Metrics::fetch(&self.http, admin).await.unwrap()
    }
}

/// Waits until `{admin}/readyz` answers 200, or panics after 20 s.
pub async fn wait_ready(http: &reqwest::Client, admin: &str) {
    let started = Instant::now();
    loop {
        if let Ok(r) = http.get(format!("{admin}/readyz")).send().await
            && r.status() == 200
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{admin} never became ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Posts `body` to the ingest at `ingest_url`, signed now with `secret`, as
/// a provider would (Standard Webhooks), with extra headers.
pub async fn post_signed(
    http: &reqwest::Client,
    ingest_url: &str,
    body: &str,
    secret: &str,
    extra: &[(&str, &str)],
) -> reqwest::Response {
    try_post_signed(http, ingest_url, body, secret, extra)
        .await
        .unwrap()
}

/// [`post_signed`], with the transport's error (a timeout, a refused
/// connection) for the caller to retry on, as a provider does.
pub async fn try_post_signed(
    http: &reqwest::Client,
    ingest_url: &str,
    body: &str,
    secret: &str,
    extra: &[(&str, &str)],
) -> reqwest::Result<reqwest::Response> {
    let mut headers: Vec<(&str, String)> = testkit::standard_headers(secret, testkit::webhook::now(), body);
    headers.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    testkit::webhook::post(http, &format!("{ingest_url}{WEBHOOK_PATH}"), body, &headers).await
}
