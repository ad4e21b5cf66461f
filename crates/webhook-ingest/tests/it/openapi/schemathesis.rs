//! The document against the running binaries: schemathesis's generated
//! requests, each answer checked against what the document says.

use super::*;

const REQUIREMENTS: &str = "scripts/schemathesis-requirements.txt";
const HOOKS: &str = "scripts/schemathesis_hooks.py";

/// Every check schemathesis runs on each answer while the database is up.
const CHECKS: &[&str] = &[
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
];
/// With the database down the 503 is the documented answer, so a 5xx is
/// no failure in itself; each must still be documented, with its headers.
const CHECKS_WITH_5XX: &[&str] = &[
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
];

/// Schemathesis's `--max-examples` (per operation; its coverage phase adds
/// its own boundary cases): the webhook's run sends about 220 requests, in
/// 5 to 10 s on two cores, enough for the hook to reach every outcome.
const MAX_EXAMPLES: u32 = 100;
/// A run that takes longer is stuck.
const RUN_TIMEOUT: Duration = Duration::from_secs(90);
/// The seed of every run, unless `OPENAPI_SEED` says otherwise: a failure
/// reproduces, and CI does not find a new input on an unrelated change.
const DEFAULT_SEED: &str = "20261203";
/// Pending orders the hook steers payments and refunds to.
const ORDERS: i64 = 40;

/// The `outcome` labels of `webhook_requests_total` a run against a working
/// ingest must have produced: every `status` of a 200, the replay, and each
/// 4xx the hook provokes. Each of these answers was then checked against
/// the document.
const OUTCOMES_REACHED: &[&str] = &[
    "processed",
    "refunded",
    "already_paid",
    "order_refunded",
    "unmatched",
    "ignored",
    "duplicate",
    "invalid_signature",
    "malformed",
    "too_large",
];

#[tokio::test]
async fn the_ingest_answers_as_documented_in_the_standard_scheme() {
    ingest_answers_as_documented("standard", SECRET).await;
}

#[tokio::test]
async fn the_ingest_answers_as_documented_in_the_stripe_scheme() {
    ingest_answers_as_documented("stripe", STRIPE_SECRET).await;
}

async fn ingest_answers_as_documented(scheme: &str, secret: &str) {
    let Some(st) = Schemathesis::provide() else {
        return;
    };
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .execute(
            "INSERT INTO orders (id, payment_id, status)
             SELECT g, 'pay_openapi_' || g, 'pending' FROM generate_series(1, $1::int8) AS g",
            &[&ORDERS],
        )
        .await
        .unwrap();
    let name = format!("ingest-{scheme}");
    let ingest = Service::ingest(
        &name,
        &testkit::login_url(&db.url, Role::Ingest).await,
        scheme,
        secret,
    );
    ingest.wait_until_ready().await;

    let payment_ids: Vec<String> = (1..=ORDERS).map(|n| format!("pay_openapi_{n}")).collect();
    st.run(&Run {
        name: &name,
        base_url: &ingest.url,
        operations: Operations::Webhook,
        checks: CHECKS,
        hook_env: vec![
            ("OPENAPI_SCHEME", scheme.to_owned()),
            ("OPENAPI_SECRET", secret.to_owned()),
            ("OPENAPI_PAYMENT_IDS", payment_ids.join(",")),
        ],
    })
    .await;
    let metrics = ingest.metrics().await;
    for outcome in OUTCOMES_REACHED {
        assert!(
            metrics.get("webhook_requests_total", &[("outcome", outcome)]) > 0.0,
            "no request got the answer `{outcome}` (log: {})",
            ingest.log.display()
        );
    }

    st.run(&Run {
        name: &format!("{name}-admin"),
        base_url: &ingest.admin_url,
        operations: Operations::Admin,
        checks: CHECKS,
        hook_env: Vec::new(),
    })
    .await;
}

#[tokio::test]
async fn with_its_database_down_the_ingest_answers_as_documented() {
    let Some(st) = Schemathesis::provide() else {
        return;
    };
    // Nothing listens there: every connection is refused at once.
    let down = format!("postgres://nobody@127.0.0.1:{}/none", testkit::free_port());
    let ingest = Service::ingest("ingest-down", &down, "standard", SECRET);
    ingest.wait_until_serving().await;

    st.run(&Run {
        name: "ingest-down",
        base_url: &ingest.url,
        operations: Operations::Webhook,
        checks: CHECKS_WITH_5XX,
        hook_env: vec![
            ("OPENAPI_SCHEME", "standard".to_owned()),
            ("OPENAPI_SECRET", SECRET.to_owned()),
        ],
    })
    .await;
    let metrics = ingest.metrics().await;
    assert!(
        metrics.get("webhook_requests_total", &[("outcome", "unavailable")]) > 0.0,
        "no signed event was answered 503"
    );
    assert_eq!(
        metrics.get("webhook_requests_total", &[("outcome", "internal_error")]),
        0.0,
        "a 500 with the database down (log: {})",
        ingest.log.display()
    );

    st.run(&Run {
        name: "ingest-down-admin",
        base_url: &ingest.admin_url,
        operations: Operations::Admin,
        checks: CHECKS_WITH_5XX,
        hook_env: Vec::new(),
    })
    .await;
}

#[tokio::test]
async fn the_relays_admin_endpoints_answer_as_documented() {
    let Some(st) = Schemathesis::provide() else {
        return;
    };
    let Some(relay_bin) = sibling_binary("outbox-relay") else {
        return;
    };
    let db = TestDb::new().await;
    // No row is ever pending: the downstream APIs are never called.
    let nowhere = format!("http://127.0.0.1:{}", testkit::free_port());
    let relay = Service::spawn(
        "relay",
        &relay_bin,
        &[
            ("DATABASE_URL", testkit::login_url(&db.url, Role::Relay).await),
            ("FULFILMENT_URL", nowhere.clone()),
            ("EMAIL_URL", nowhere),
        ],
    );
    relay.wait_until_ready().await;
    st.run(&Run {
        name: "relay-admin",
        base_url: &relay.admin_url,
        operations: Operations::Admin,
        checks: CHECKS,
        hook_env: Vec::new(),
    })
    .await;
}

/// `CI` set (and not `false` or `0`): what cannot run fails instead of skipping.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// The test passes without running, saying why; in CI it fails.
fn skip(why: &str) {
    assert!(!in_ci(), "CI is set and {why}");
    eprintln!("SKIPPED (CI is not set): {why}");
}

/// `name`, a binary of the workspace built beside this test's (`make test`
/// builds them all), if it is there.
fn sibling_binary(name: &str) -> Option<PathBuf> {
    let ingest = PathBuf::from(env!("CARGO_BIN_EXE_webhook-ingest"));
    let path = ingest.with_file_name(name);
    if path.exists() {
        return Some(path);
    }
    skip(&format!(
        "{} is not built (`cargo build --workspace --bins`, as `make test` does)",
        path.display()
    ));
    None
}

/// A folder of its own under target/openapi/ for a run's files.
fn work_dir(name: &str) -> PathBuf {
    let dir = testkit::workspace_root()
        .join("target/openapi")
        .join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Schemathesis in its venv, installed on first use.
pub(super) struct Schemathesis {
    venv: PathBuf,
}

impl Schemathesis {
    /// The venv with exactly the pinned requirements, installed (once, under
    /// a lock: the tests run in parallel processes) when missing or when
    /// the requirements changed. `None` when Python is unavailable.
    pub(super) fn provide() -> Option<Self> {
        let root = testkit::workspace_root();
        let venv = root.join("target/schemathesis-venv");
        let requirements = std::fs::read_to_string(root.join(REQUIREMENTS)).unwrap();
        std::fs::create_dir_all(root.join("target")).unwrap();
        let lock = std::fs::File::create(root.join("target/schemathesis-venv.lock")).unwrap();
        lock.lock().unwrap();
        let stamp = venv.join(".requirements");
        let st = Self { venv };
        if st.bin("st").exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == requirements) {
            return Some(st);
        }
        let _ = std::fs::remove_dir_all(&st.venv);
        let created = std::process::Command::new("python3")
            .args(["-m", "venv"])
            .arg(&st.venv)
            .output();
        match created {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                skip(&format!(
                    "`python3 -m venv` failed (on Debian: apt-get install python3-venv): {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
                return None;
            }
            Err(e) => {
                skip(&format!(
                    "python3 is not available ({e}): schemathesis cannot run"
                ));
                return None;
            }
        }
        eprintln!("installing {REQUIREMENTS} into {}", st.venv.display());
        let installed = std::process::Command::new(st.bin("python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-input",
                "-r",
            ])
            .arg(root.join(REQUIREMENTS))
            .output()
            .unwrap();
        assert!(
            installed.status.success(),
            "installing {REQUIREMENTS} from PyPI failed:\n{}",
            String::from_utf8_lossy(&installed.stderr)
        );
        std::fs::write(&stamp, requirements).unwrap();
        Some(st)
    }

    fn bin(&self, name: &str) -> PathBuf {
        self.venv.join("bin").join(name)
    }

    /// docs/openapi.yaml as JSON (read by the venv's PyYAML).
    pub(super) fn document(&self) -> serde_json::Value {
        let out = std::process::Command::new(self.bin("python"))
            .args([
                "-c",
                "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)",
            ])
            .arg(testkit::workspace_root().join(DOCUMENT))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `st run` of the document against `run.base_url`; fails the test with
    /// schemathesis's report unless every check passed on every answer.
    async fn run(&self, run: &Run<'_>) {
        let root = testkit::workspace_root();
        let seed = std::env::var("OPENAPI_SEED").unwrap_or_else(|_| DEFAULT_SEED.to_owned());
        let dir = work_dir(&format!("{}-schemathesis", run.name));
        let mut command = tokio::process::Command::new(self.bin("st"));
        command
            .arg("run")
            .arg(root.join(DOCUMENT))
            .args(["--url", run.base_url])
            .args(run.operations.filter())
            .args(["--checks", &run.checks.join(",")])
            .args(["--phases", "examples,coverage,fuzzing"])
            .args(["--max-examples", &MAX_EXAMPLES.to_string()])
            .args(["--seed", &seed])
            .args(["--workers", "1"])
            .args(["--generation-database", "none", "--no-color"])
            // Its files (none expected) stay out of the working tree.
            .current_dir(&dir)
            .env("SCHEMATHESIS_HOOKS", root.join(HOOKS))
            .env("OPENAPI_HOOK_SEED", &seed)
            .env("NO_PROXY", "127.0.0.1")
            .envs(run.hook_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(RUN_TIMEOUT, command.output())
            .await
            .unwrap_or_else(|_| panic!("schemathesis ({}) ran past {RUN_TIMEOUT:?}", run.name))
            .unwrap();
        // A failure's curl line carries the whole body (the hook sends some
        // over 256 KiB): long lines are cut.
        let report: String = String::from_utf8_lossy(&out.stdout)
            .lines()
            .chain(String::from_utf8_lossy(&out.stderr).lines())
            .map(|line| match line.char_indices().nth(400) {
                Some((cut, _)) => format!("{}...\n", &line[..cut]),
                None => format!("{line}\n"),
            })
            .collect();
        assert!(
            out.status.success(),
            "schemathesis ({}) found answers that docs/openapi.yaml does not describe (seed {seed}):\n{report}",
            run.name
        );
        let summary: Vec<&str> = report
            .lines()
            .filter(|l| l.contains("generated") || l.contains("No issues found"))
            .collect();
        println!("schemathesis ({}): {}", run.name, summary.join(" / ").trim());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

struct Run<'a> {
    name: &'a str,
    base_url: &'a str,
    operations: Operations,
    checks: &'a [&'a str],
    /// What the hook needs to sign (for the webhook).
    hook_env: Vec<(&'static str, String)>,
}

/// Which of the document's operations a run sends: one listener serves each.
enum Operations {
    Webhook,
    Admin,
}

impl Operations {
    fn filter(&self) -> [&'static str; 2] {
        match self {
            Self::Webhook => ["--include-path", WEBHOOK_PATH],
            Self::Admin => ["--include-tag", "admin"],
        }
    }
}

/// A service binary serving on loopback ports of its own, killed on drop;
/// its logs go to a file, kept when the test fails.
struct Service {
    /// The webhook listener (the ingest's).
    url: String,
    admin_url: String,
    log: PathBuf,
    _child: tokio::process::Child,
}

impl Service {
    fn ingest(name: &str, database_url: &str, scheme: &str, secret: &str) -> Self {
        let port = testkit::free_port();
        let mut ingest = Self::spawn(
            name,
            Path::new(env!("CARGO_BIN_EXE_webhook-ingest")),
            &[
                ("INGEST_LISTEN_ADDR", format!("127.0.0.1:{port}")),
                ("DATABASE_URL", database_url.to_owned()),
                ("WEBHOOK_SIGNATURE_SCHEME", scheme.to_owned()),
                ("WEBHOOK_SECRETS", secret.to_owned()),
            ],
        );
        ingest.url = format!("http://127.0.0.1:{port}");
        ingest
    }

    fn spawn(name: &str, bin: &Path, env: &[(&str, String)]) -> Self {
        let admin_port = testkit::free_port();
        let log = work_dir(name).join("service.log");
        let file = std::fs::File::create(&log).unwrap();
        let child = tokio::process::Command::new(bin)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("ADMIN_LISTEN_ADDR", format!("127.0.0.1:{admin_port}"))
            .env("LOG_FORMAT", "json")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", bin.display()));
        Self {
            url: String::new(),
            admin_url: format!("http://127.0.0.1:{admin_port}"),
            log,
            _child: child,
        }
    }

    async fn wait_until_ready(&self) {
        self.wait_for("/readyz").await;
    }

    async fn wait_until_serving(&self) {
        self.wait_for("/healthz").await;
    }

    async fn wait_for(&self, path: &str) {
        let http = testkit::http();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = http.get(format!("{}{path}", self.admin_url)).send().await
                && r.status() == 200
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{path} not 200 within 20 s; log: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn metrics(&self) -> testkit::metrics::Metrics {
        testkit::metrics::Metrics::fetch(&testkit::http(), &self.admin_url)
            .await
            .unwrap()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if !std::thread::panicking()
            && let Some(dir) = self.log.parent()
        {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
