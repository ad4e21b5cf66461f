//! `simulator provider` as scripts run it: the summary line on stdout, the
//! table and progress on stderr, the ack file, the exit code.

use std::process::Output;

use simulator::provider::{AckRecord, Scheme, Summary};
use tokio::process::Command;

use crate::fake::{Behaviour, FakeIngest};
use crate::helpers::{STANDARD_SECRET, secret_of};

const BIN: &str = env!("CARGO_BIN_EXE_simulator");

async fn provider(target: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args([
            "provider",
            "--target",
            target,
            "--secret",
            STANDARD_SECRET,
            "--run-id",
            "bin",
        ])
        .args(["--retry-base-ms", "5", "--retry-max-ms", "50"])
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .unwrap()
}

fn summary_line(output: &Output) -> Summary {
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one line on stdout: {stdout}");
    serde_json::from_str(&stdout).unwrap()
}

#[tokio::test]
async fn success_prints_progress_the_table_and_one_json_line() {
    let fake = FakeIngest::start(
        Scheme::Standard,
        secret_of(Scheme::Standard),
        100,
        Behaviour::default(),
    )
    .await;
    let acks = std::env::temp_dir().join(format!("provider-bin-acks-{}.jsonl", std::process::id()));
    // Six events at four a second: 1.25 s, so at least one progress line.
    let output = provider(
        &fake.url,
        &[
            "--rate",
            "4",
            "--events",
            "6",
            "--json",
            "--ack-file",
            acks.to_str().unwrap(),
        ],
    )
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let summary = summary_line(&output);
    assert_eq!(
        (summary.events, summary.acknowledged, summary.deliveries),
        (6, 6, 6)
    );
    assert_eq!(summary.run_id, "bin");
    assert!(summary.cpu_secs.is_some() || !cfg!(target_os = "linux"));
    assert!(stderr.contains("[provider] 1.0s  events "), "{stderr}");
    assert!(stderr.contains("[provider] run bin (seed "), "{stderr}");
    assert!(stderr.contains("latency ms   p50 "), "{stderr}");

    let text = std::fs::read_to_string(&acks).unwrap();
    std::fs::remove_file(&acks).unwrap();
    let records: Vec<AckRecord> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 6);
    assert!(
        records
            .iter()
            .all(|r| r.acknowledged && r.status.as_deref() == Some("processed"))
    );
}

#[tokio::test]
async fn exit_1_when_the_target_never_acknowledges_in_time() {
    let unavailable = Behaviour {
        always: Some(503),
        ..Behaviour::default()
    };
    let fake = FakeIngest::start(Scheme::Standard, secret_of(Scheme::Standard), 10, unavailable).await;
    let output = provider(
        &fake.url,
        &[
            "--events",
            "3",
            "--concurrency",
            "3",
            "--give-up-after-ms",
            "400",
            "--json",
            "--no-progress",
        ],
    )
    .await;
    assert_eq!(output.status.code(), Some(1));
    let summary = summary_line(&output);
    assert_eq!((summary.acknowledged, summary.failed), (0, 3));
    assert!(summary.status_counts["503"] >= 3, "{summary:?}");
    assert!(summary.elapsed_secs < 2.0);
}

#[tokio::test]
async fn permanent_failures_exit_1_unless_allowed() {
    let other_secret = FakeIngest::start(
        Scheme::Standard,
        "whsec_QUJDREVGR0hJSktMTU5PUA==",
        10,
        Behaviour::default(),
    )
    .await;
    let refused = provider(&other_secret.url, &["--events", "2", "--no-progress"]).await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(refused.stdout.is_empty(), "no --json, nothing on stdout");
    let allowed = provider(
        &other_secret.url,
        &["--events", "2", "--no-progress", "--allow-failures"],
    )
    .await;
    assert_eq!(allowed.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&allowed.stderr);
    assert!(stderr.contains("2 failed (2 permanently)"), "{stderr}");
}

#[tokio::test]
async fn a_bad_flag_is_one_line_and_exit_2() {
    for args in [
        &[
            "provider",
            "--target",
            "http://127.0.0.1:1",
            "--secret",
            "s",
            "--events",
            "1",
            "--refund-rate",
            "2",
        ][..],
        &[
            "provider",
            "--target",
            "http://127.0.0.1:1",
            "--secret",
            "s",
            "--scheme",
            "stripe",
        ],
        &["provider", "--secret", "s", "--events", "1"],
        &[
            "provider",
            "--target",
            "http://127.0.0.1:1",
            "--secret",
            "not base64!",
            "--events",
            "1",
        ],
    ] {
        let output = Command::new(BIN).args(args).output().await.unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        // A flag typed wrong is a usage error that says which --help to
        // read; what only the settings together break, a configuration error.
        let usage = stderr.starts_with("simulator: usage error: ");
        assert!(
            usage || stderr.starts_with("simulator: configuration error: "),
            "{stderr}"
        );
        assert!(!usage || stderr.trim_end().ends_with("--help`)"), "{stderr}");
        assert!(stderr.contains("PROVIDER_"), "{stderr}");
        assert!(output.stdout.is_empty());
    }
}
