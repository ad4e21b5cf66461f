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
