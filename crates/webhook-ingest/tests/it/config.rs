//! Configuration errors: exit 2, one line on stderr naming the variable, no panic.

use std::process::Command;

fn run(env: &[(&str, &str)], args: &[&str]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_webhook-ingest"));
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stderr).unwrap(),
    )
}

const DB: (&str, &str) = ("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none");
const SECRETS: (&str, &str) = ("WEBHOOK_SECRETS", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");

#[test]
fn each_invalid_setting_is_one_line_naming_the_variable() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[SECRETS], "DATABASE_URL"),
        (&[DB], "WEBHOOK_SECRETS"),
        (&[DB, ("WEBHOOK_SECRETS", "whsec_***")], "WEBHOOK_SECRETS"),
        (&[DB, ("WEBHOOK_SECRETS", "")], "WEBHOOK_SECRETS"),
        (
            &[DB, SECRETS, ("WEBHOOK_TOLERANCE_SECS", "soon")],
            "WEBHOOK_TOLERANCE_SECS",
        ),
        (
            &[DB, SECRETS, ("WEBHOOK_TOLERANCE_SECS", "-1")],
            "WEBHOOK_TOLERANCE_SECS",
        ),
        (
            &[DB, SECRETS, ("WEBHOOK_SIGNATURE_SCHEME", "hmac")],
            "WEBHOOK_SIGNATURE_SCHEME",
        ),
        (&[DB, SECRETS, ("INGEST_DEADLINE_MS", "0")], "INGEST_DEADLINE_MS"),
        (
            &[DB, SECRETS, ("INGEST_LISTEN_ADDR", "everywhere")],
            "INGEST_LISTEN_ADDR",
        ),
        (
            &[DB, SECRETS, ("ADMIN_LISTEN_ADDR", "localhost")],
            "ADMIN_LISTEN_ADDR",
        ),
        (&[DB, SECRETS, ("LOG_FORMAT", "xml")], "LOG_FORMAT"),
        (&[DB, SECRETS, ("DATABASE_POOL_SIZE", "0")], "DATABASE_POOL_SIZE"),
        (
            &[
                ("DATABASE_URL", "postgres://u:hunter2@h/db?sslmode=often"),
                SECRETS,
            ],
            "DATABASE_URL",
        ),
    ];
    for (env, variable) in cases {
        let (code, stderr) = run(env, &[]);
        assert_eq!(code, 2, "{variable}: {stderr}");
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{variable}: one line, got {stderr:?}"
        );
        assert!(stderr.contains(variable), "{variable} not named in {stderr:?}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(!stderr.contains("hunter2"), "a password leaked: {stderr}");
        assert!(!stderr.contains("MfKQ9r8G"), "a secret leaked: {stderr}");
    }
}

#[test]
fn help_lists_every_variable() {
    let out = Command::new(env!("CARGO_BIN_EXE_webhook-ingest"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for var in [
        "DATABASE_URL",
        "INGEST_LISTEN_ADDR",
        "ADMIN_LISTEN_ADDR",
        "WEBHOOK_SIGNATURE_SCHEME",
        "WEBHOOK_SECRETS",
        "WEBHOOK_TOLERANCE_SECS",
        "INGEST_DEADLINE_MS",
        "LOG_FORMAT",
    ] {
        assert!(help.contains(var), "--help does not mention {var}");
    }
}

#[test]
fn help_never_shows_a_secret_set_in_the_environment() {
    let out = Command::new(env!("CARGO_BIN_EXE_webhook-ingest"))
        .arg("--help")
        .env("DATABASE_URL", "postgres://u:hunter2@h/db")
        .env("WEBHOOK_SECRETS", SECRETS.1)
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(!help.contains("hunter2"), "a password leaked: {help}");
    assert!(!help.contains("MfKQ9r8G"), "a secret leaked: {help}");
}

/// Exit codes: 2 is the operator's to fix (above); 1 is a failure at run
/// time, one line on stderr naming what failed.
#[test]
fn a_failure_at_run_time_exits_1_with_one_line() {
    // Nothing listens on port 1: the connection is refused at once.
    let (code, stderr) = run(&[DB], &["migrate"]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line, got {stderr:?}");
    assert!(stderr.starts_with("webhook-ingest: error: "), "{stderr}");

    // The admin port is taken: serving fails at start-up, naming the variable.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let admin = taken.local_addr().unwrap().to_string();
    let env = [
        DB,
        SECRETS,
        ("INGEST_LISTEN_ADDR", "127.0.0.1:0"),
        ("ADMIN_LISTEN_ADDR", &admin),
    ];
    let (code, stderr) = run(&env, &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("ADMIN_LISTEN_ADDR"), "{stderr}");
    assert!(!stderr.contains("MfKQ9r8G"), "a secret leaked: {stderr}");
}

/// A signing key shorter than 16 bytes (after base64 decoding of `whsec_`)
/// is refused at start-up: exit 2, one line naming `WEBHOOK_SECRETS`, the
/// key not shown. Before, the process started serving with it.
#[test]
fn short_signing_keys_are_refused() {
    let fifteen = "whsec_MDEyMzQ1Njc4OWFiY2Rl"; // "0123456789abcde"
    let cases: &[&[(&str, &str)]] = &[
        &[DB, ("WEBHOOK_SECRETS", "whsec_QQ==")],
        &[DB, ("WEBHOOK_SECRETS", fifteen)],
        &[DB, ("WEBHOOK_SECRETS", &format!("{},{fifteen}", SECRETS.1))],
        &[
            DB,
            ("WEBHOOK_SIGNATURE_SCHEME", "stripe"),
            ("WEBHOOK_SECRETS", "sk_shortkey"),
        ],
    ];
    for env in cases {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_webhook-ingest"));
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("ADMIN_LISTEN_ADDR", "127.0.0.1:0")
            .env("INGEST_LISTEN_ADDR", "127.0.0.1:0")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        for (k, v) in *env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                panic!("{env:?}: still running with a short key after 10 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{env:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
        assert!(
            stderr.contains("WEBHOOK_SECRETS") && stderr.contains("16"),
            "{stderr}"
        );
        for secret in ["QQ==", "MDEyMzQ1", "sk_shortkey", "MfKQ9r8G"] {
            assert!(!stderr.contains(secret), "a secret leaked: {stderr}");
        }
    }
}

/// A wrong command line is a usage error (exit 2) that says which `--help`
/// to read; a status is taken in any case; a window needs its unit; a
/// negative limit is a value out of range, not an unknown argument.
#[test]
fn command_line_errors_are_usage_errors_with_their_help() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["events", "list", "--status", "bogus"],
            "unknown status `bogus` (processed,",
        ),
        (
            &["events", "list", "--since", "5"],
            "`5`: expected a number and a unit",
        ),
        (&["events", "list", "--limit", "-1"], "-1 is not in 1..=100000"),
        (&["events", "show"], "<ID>"),
    ];
    for (args, says) in cases {
        let (code, stderr) = run(&[DB], args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("webhook-ingest: usage error: "),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        let command = args[..2].join(" ");
        assert!(
            stderr
                .trim_end()
                .ends_with(&format!("(try `webhook-ingest {command} --help`)")),
            "{args:?}: {stderr}"
        );
    }
    // Accepted: the run gets as far as the database, which is not there (exit 1).
    for args in [
        &["events", "list", "--status", "Processed"][..],
        &["migrate", "--json"],
    ] {
        let (code, stderr) = run(&[DB], args);
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(stderr.contains("check the host, the port"), "{args:?}: {stderr}");
    }
}
