//! The binary as scripts start it.

use std::time::Duration;

use simulator::proxy::Stats;
use testkit::process::AnnouncingProcess;
use tokio::process::Command;

use crate::helpers::{client, ship};

const BIN: &str = env!("CARGO_BIN_EXE_simulator");

#[tokio::test]
async fn prints_its_addresses_forwards_takes_faults_and_stops_on_sigterm() {
    let downstream = simulator::downstream::spawn(Default::default()).await.unwrap();
    let mut command = Command::new(BIN);
    command
        .args(["proxy", "--listen", "127.0.0.1:0", "--delay-ms", "1"])
        .env("PROXY_UPSTREAM", downstream.addr().to_string())
        .env("RUST_LOG", "info");
    let (server, line) = AnnouncingProcess::spawn(command).await;
    let announced: serde_json::Value = serde_json::from_str(&line).unwrap();
    let addr = announced["listening"].as_str().unwrap();
    let control = announced["control"].as_str().unwrap();
    for a in [addr, control] {
        assert!(a.starts_with("127.0.0.1:") && !a.ends_with(":0"), "{line}");
    }
    assert_eq!(
        line,
        format!("{{\"listening\":\"{addr}\",\"control\":\"{control}\"}}\n")
    );

    let http = client(Duration::from_secs(5));
    assert_eq!(ship(&http, &format!("http://{addr}"), 1).await.unwrap(), 201);
    let set = http
        .post(format!("http://{control}/faults"))
        .body(r#"{"cut_after_bytes": 0}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    assert!(ship(&http, &format!("http://{addr}"), 2).await.is_err());
    let stats: Stats = http
        .get(format!("http://{control}/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats.injected.cuts, 1);
    assert!(stats.injected.delays >= 2, "--delay-ms applied: {stats:?}");
    assert_eq!(downstream.stats().effects, 2);

    let logs = server.terminate().await;
    assert!(
        logs.contains("proxy forwarding") && logs.contains("faults changed"),
        "{logs}"
    );
}

#[tokio::test]
async fn a_bad_flag_is_one_line_and_exit_2() {
    for args in [
        &["proxy"][..],
        &["proxy", "--upstream", "nowhere"],
        &["proxy", "--upstream", "127.0.0.1:1", "--cut-rate", "2"],
        &[
            "proxy",
            "--upstream",
            "127.0.0.1:1",
            "--cut-rate",
            "0.6",
            "--blackhole-rate",
            "0.6",
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
        assert!(output.stdout.is_empty());
    }
}
