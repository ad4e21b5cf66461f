//! The binary as `make run` and `make bench` start it.

use testkit::process::AnnouncingProcess;
use tokio::process::Command;

use crate::helpers::{client, shipment};

const BIN: &str = env!("CARGO_BIN_EXE_simulator");

#[tokio::test]
async fn prints_its_listening_line_serves_and_stops_on_sigterm() {
    let mut command = Command::new(BIN);
    command
        .args([
            "downstream",
            "--listen",
            "127.0.0.1:0",
            "--rate-429",
            "1",
            "--retry-after-secs",
            "2",
        ])
        .env("RUST_LOG", "info");
    let (server, line) = AnnouncingProcess::spawn(command).await;
    let announced: serde_json::Value = serde_json::from_str(&line).unwrap();
    let addr = announced["listening"].as_str().unwrap();
    assert!(addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"), "{line}");
    assert_eq!(line, format!("{{\"listening\":\"{addr}\"}}\n"));

    let http = client();
    let answer = http
        .post(format!("http://{addr}/shipments"))
        .header("idempotency-key", "ship-1")
        .body(shipment(1))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 429);
    assert_eq!(answer.headers()["retry-after"], "2");
    let stats: simulator::downstream::Stats = http
        .get(format!("http://{addr}/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!((stats.requests, stats.effects), (1, 0));

    let logs = server.terminate().await;
    assert!(logs.contains("downstream serving"), "{logs}");
}

#[tokio::test]
async fn a_bad_flag_is_one_line_and_exit_2() {
    for args in [
        &["downstream", "--error-rate", "2"][..],
        &["downstream", "--error-rate", "0.6", "--reset-rate", "0.6"],
        &["downstream", "--latency-ms", "p50:9"],
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
        assert!(output.stdout.is_empty());
    }
}
