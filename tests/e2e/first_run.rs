//! What a first run meets. A service that cannot reach its database says
//! why in its log, with the setting to check, once per cause however often
//! `/readyz` is probed, and says when it is back; `/readyz` itself names no
//! detail. A command run on a database never migrated says to migrate it.
//! The two services started side by side do not fight over a port, and a
//! subcommand's help is its own.

use std::time::{Duration, Instant};

use testkit::{Role, TestDb};

use crate::harness::{Proc, SECRET, TempDir, wait_ready};

/// The ingest with a wrong password, then the relay with nothing listening
/// on the database's port: each log names the server's refusal or the
/// connection's failure, and what to check, once.
#[tokio::test]
async fn a_service_without_its_database_logs_the_cause_once() {
    let db = TestDb::new().await;
    let dir = TempDir(std::env::temp_dir().join(format!("e2e-unreachable-{}", testkit::free_port())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let http = testkit::http();

    let wrong_password = testkit::url_with_user(&db.url, Role::Ingest.login(), "not-the-password");
    let (mut ingest, admin) = spawn(
        "webhook-ingest",
        &[
            ("DATABASE_URL", wrong_password),
            ("WEBHOOK_SECRETS", SECRET.to_owned()),
            (
                "INGEST_LISTEN_ADDR",
                format!("127.0.0.1:{}", testkit::free_port()),
            ),
        ],
        &dir,
    );
    probe_unready(&http, &admin, 5).await;
    ingest.stop(Duration::from_secs(10));
    let log = ingest.log();
    assert_said_once(
        &log,
        "database unreachable: db error: FATAL: password authentication failed for user",
        "check the user and password in DATABASE_URL",
    );
    assert!(
        !log.contains("not-the-password"),
        "the password reached the log:\n{log}"
    );

    // Nothing listens on a port just found free. The pretty format, its
    // output a file: plain text, no terminal colours.
    let refused = format!(
        "postgres://u:p@127.0.0.1:{}/db?sslmode=disable",
        testkit::free_port()
    );
    let (mut relay, admin) = spawn(
        "outbox-relay",
        &[
            ("DATABASE_URL", refused),
            ("FULFILMENT_URL", "http://127.0.0.1:9/".to_owned()),
            ("EMAIL_URL", "http://127.0.0.1:9/".to_owned()),
            ("LOG_FORMAT", "pretty".to_owned()),
        ],
        &dir,
    );
    probe_unready(&http, &admin, 5).await;
    relay.stop(Duration::from_secs(10));
    let log = relay.log();
    assert!(
        !log.contains('\x1b'),
        "colours in a log that is not a terminal:\n{log:?}"
    );
    assert_said_once(
        &log,
        "error connecting to server: Connection refused",
        "check the host, the port",
    );
}

/// Once the database answers again, the service says so, and no more.
#[tokio::test]
async fn a_service_says_when_its_database_is_back() {
    let cluster = testkit::PrivateCluster::start().expect("a private cluster");
    let url = cluster.migrated_database("back").await.unwrap();
    let dir = TempDir(std::env::temp_dir().join(format!("e2e-back-{}", testkit::free_port())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let http = testkit::http();
    let (mut ingest, admin) = spawn(
        "webhook-ingest",
        &[
            ("DATABASE_URL", url),
            ("WEBHOOK_SECRETS", SECRET.to_owned()),
            (
                "INGEST_LISTEN_ADDR",
                format!("127.0.0.1:{}", testkit::free_port()),
            ),
        ],
        &dir,
    );
    wait_ready(&http, &admin).await;
    cluster.stop().unwrap();
    probe_unready(&http, &admin, 3).await;
    cluster.resume().unwrap();
    wait_ready(&http, &admin).await;
    ingest.stop(Duration::from_secs(10));
    let log = ingest.log();
    assert_eq!(log.matches("database ready: schema current").count(), 1, "{log}");
}

/// Every operator command that reads the tables, on a database that exists
/// but was never migrated: exit 1, and the fix, not only the server's words.
#[tokio::test]
async fn commands_on_an_unmigrated_database_say_to_migrate() {
    let admin = testkit::admin_url();
    let client = db::Database::parse(&admin).unwrap().connect("e2e").await.unwrap();
    let name = format!("unmigrated_{}", testkit::free_port());
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let url = testkit::url_with_dbname(&admin, &name);
    let commands: [(&str, &[&str]); 5] = [
        ("webhook-ingest", &["events", "list"]),
        ("webhook-ingest", &["events", "show", "evt_1"]),
        ("outbox-relay", &["stats"]),
        ("outbox-relay", &["dead", "list"]),
        ("outbox-relay", &["audit"]),
    ];
    for (program, args) in commands {
        let out = std::process::Command::new(testkit::bin::path(program))
            .args(args)
            .env_clear()
            .env("DATABASE_URL", &url)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{program} {args:?}: {stderr}");
        assert!(
            stderr.contains("the database is not migrated: run `webhook-ingest migrate`"),
            "{program} {args:?}: {stderr}"
        );
    }
    client
        .batch_execute(&format!("DROP DATABASE {name}"))
        .await
        .unwrap();
}

fn spawn(name: &'static str, env: &[(&str, String)], dir: &TempDir) -> (Proc, String) {
    let admin_port = testkit::free_port();
    let mut env: Vec<(String, String)> = env.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
    env.push(("ADMIN_LISTEN_ADDR".into(), format!("127.0.0.1:{admin_port}")));
    (
        Proc::spawn(name, &env, &dir.0),
        format!("http://127.0.0.1:{admin_port}"),
    )
}

/// Asks `/readyz` until it has answered 503 `times` times, each with the
/// fixed words and no detail.
async fn probe_unready(http: &reqwest::Client, admin: &str, times: usize) {
    let started = Instant::now();
    let mut answered = 0;
    while answered < times {
        if let Ok(r) = http.get(format!("{admin}/readyz")).send().await {
            assert_eq!(r.status(), 503);
            assert_eq!(r.text().await.unwrap(), "not ready: database unavailable\n");
            answered += 1;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{admin}/readyz never answered"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// One "not ready" line, naming `cause` and `check`.
fn assert_said_once(log: &str, cause: &str, check: &str) {
    let said: Vec<&str> = log.lines().filter(|l| l.contains("not ready:")).collect();
    assert_eq!(said.len(), 1, "said once per cause, not per probe:\n{log}");
    assert!(said[0].contains(cause), "the cause is missing: {}", said[0]);
    assert!(
        said[0].contains(check),
        "the setting to check is missing: {}",
        said[0]
    );
}

/// Both services started with their defaults on one machine do not fight
/// over the admin port: the ingest's is 9090, the relay's 9091.
#[test]
fn the_two_services_default_to_different_admin_ports() {
    let default_of = |program: &str| {
        let out = std::process::Command::new(testkit::bin::path(program))
            .arg("--help")
            .env_clear()
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout).into_owned();
        let at = help
            .find("--admin-listen-addr")
            .expect("the admin flag in --help");
        let default = &help[at..];
        let start = default.find("[default: ").unwrap() + "[default: ".len();
        default[start..start + default[start..].find(']').unwrap()].to_owned()
    };
    assert_eq!(default_of("webhook-ingest"), "0.0.0.0:9090");
    assert_eq!(default_of("outbox-relay"), "0.0.0.0:9091");
}

/// Each subcommand's `--help` shows its own flags, the few every command
/// takes (the database, the log format), and examples: not the service's
/// settings, which the top-level `--help` lists.
#[test]
fn a_subcommands_help_shows_its_own_flags_and_examples() {
    let help = |program: &str, args: &[&str]| {
        let out = std::process::Command::new(testkit::bin::path(program))
            .args(args)
            .arg("--help")
            .env_clear()
            .output()
            .unwrap();
        assert!(out.status.success(), "{program} {args:?} --help");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let cases: [(&str, &[&str], &str); 5] = [
        ("webhook-ingest", &["migrate"], "--json"),
        ("webhook-ingest", &["events", "show"], "<ID>"),
        ("webhook-ingest", &["events", "list"], "--status"),
        ("outbox-relay", &["dead", "show"], "<ID>"),
        ("outbox-relay", &["stats"], "--json"),
    ];
    for (program, args, own) in cases {
        let text = help(program, args);
        assert!(
            text.contains(own) && text.contains("--database-url"),
            "{program} {args:?}:\n{text}"
        );
        assert!(
            text.contains("Examples:\n  "),
            "{program} {args:?} has no example:\n{text}"
        );
        for server_only in [
            "--admin-listen-addr",
            "--ingest-listen-addr",
            "--webhook-secrets",
            "--ingest-deadline-ms",
            "--relay-batch-size",
            "--fulfilment-url",
            "--database-pool-size",
        ] {
            assert!(
                !text.contains(server_only),
                "{program} {args:?} shows {server_only}:\n{text}"
            );
        }
    }
    // Each binary's default command answers to the other's name too.
    assert!(help("webhook-ingest", &["run"]).starts_with("Serve webhooks"));
    assert!(help("outbox-relay", &["serve"]).starts_with("Run the worker"));
    // The top-level help still lists every setting.
    assert!(help("outbox-relay", &[]).contains("--relay-batch-size"));
    assert!(help("webhook-ingest", &[]).contains("--webhook-secrets"));
}
