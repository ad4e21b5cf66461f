//! The relay's log line (docs/CONTRACT.md, section 8): one JSON line per finished
//! downstream call (done, retry or dead) in the event's trace, read from a
//! real relay process's stdout at the default level (`RUST_LOG` unset), and
//! compared with what the downstream itself saw.

use std::collections::{BTreeMap, HashSet};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::helpers::{RelayProcess, TRACEPARENT, env};

/// The credentials the relay is given inside its URLs: they must never be logged.
const USER: &str = "relay-login";
const PASSWORD: &str = "s3cr3t-in-the-url";

/// Reads a pipe to its end on a thread, so the child never blocks on a full pipe.
fn collect(mut pipe: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

#[tokio::test]
async fn each_finished_call_is_one_line_in_the_events_trace_with_its_status_and_duration() {
    let env = env().await;
    // (kind, order, event id, the key it sends, the outcomes in attempt order)
    let cases = [
        ("ship_order", 1, "evt_done", "ship-1", vec!["done"]),
        ("send_confirmation", 2, "evt_503", "conf-2", vec!["retry", "done"]),
        ("ship_order", 3, "evt_reset", "ship-3", vec!["retry", "done"]),
        ("send_refund_notice", 4, "evt_422", "refund-4", vec!["dead"]),
    ];
    let mut rows = Vec::new();
    for (kind, order, event_id, key, outcomes) in cases {
        rows.push((
            env.enqueue(kind, order, event_id).await,
            kind,
            event_id,
            key,
            outcomes,
        ));
    }
    env.script("conf-2", serde_json::json!([503])).await;
    env.script("ship-3", serde_json::json!(["reset"])).await;
    env.script("refund-4", serde_json::json!([422])).await;

    let url = env
        .url()
        .replacen("http://", &format!("http://{USER}:{PASSWORD}@"), 1);
    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .env("DATABASE_URL", &env.relay_url)
        .env("FULFILMENT_URL", &url)
        .env("EMAIL_URL", &url)
        .env("ADMIN_LISTEN_ADDR", "127.0.0.1:0")
        .env("LOG_FORMAT", "json")
        .env("RELAY_BACKOFF_BASE_MS", "20")
        .env("RELAY_POLL_INTERVAL_MS", "50")
        .env_remove("RUST_LOG")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning outbox-relay");
    let stdout = collect(child.stdout.take().unwrap());
    let stderr = collect(child.stderr.take().unwrap());
    let relay = RelayProcess(child);
    env.wait_for(
        "SELECT count(*) FROM outbox WHERE status IN ('done', 'dead')",
        4,
        Duration::from_secs(20),
    )
    .await;
    relay.signal("TERM");
    let (code, _) = relay.wait(Duration::from_secs(20));
    assert_eq!(code, Some(0));
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());

    for text in [&stdout, &stderr] {
        assert!(
            !text.contains(PASSWORD) && !text.contains(USER),
            "a credential from the URL was logged:\n{text}"
        );
    }
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not one JSON object ({e}): {l}")))
        .collect();
    let mut calls: BTreeMap<i64, Vec<&Value>> = BTreeMap::new();
    for line in &lines {
        if line["message"] == "downstream call finished" {
            calls
                .entry(line["outbox_id"].as_i64().unwrap())
                .or_default()
                .push(line);
        }
    }

    let stats = env.stats().await;
    let trace_id = TRACEPARENT.split('-').nth(1).unwrap();
    let parent_span_id = TRACEPARENT.split('-').nth(2).unwrap();
    let mut span_ids = HashSet::new();
    for (id, kind, event_id, key, outcomes) in &rows {
        let seen = stats.key(key);
        let lines = calls.remove(id).unwrap_or_default();
        assert_eq!(
            lines.len() as u64,
            seen.requests,
            "{key}: one line per call the downstream saw: {lines:#?}"
        );
        let got: Vec<&str> = lines.iter().map(|l| l["outcome"].as_str().unwrap()).collect();
        assert_eq!(&got, outcomes, "{key}");
        for (n, line) in lines.iter().enumerate() {
            let attempt = n as i64 + 1;
            assert_eq!(line["event_id"], *event_id, "{line}");
            assert_eq!(line["outbox_id"], *id, "{line}");
            assert_eq!(line["attempt"], attempt, "{line}");
            assert_eq!(line["idempotency_key"], *key, "{line}");
            assert_eq!(line["kind"], *kind, "{line}");
            assert_eq!(line["trace_id"], trace_id, "in the row's stored trace: {line}");
            let span_id = line["span_id"].as_str().unwrap();
            assert!(
                span_id.len() == 16
                    && span_id.chars().all(|c| c.is_ascii_hexdigit())
                    && span_id != parent_span_id,
                "the attempt's own span: {line}"
            );
            assert!(
                span_ids.insert(span_id.to_owned()),
                "one span per attempt: {line}"
            );
            assert!(line["duration_ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{line}");
            // The downstream's answer to this very call; 0 is a connection
            // dropped without one, which the line leaves without a status.
            match seen.statuses[n] {
                0 => assert!(line.get("http_status").is_none_or(Value::is_null), "{line}"),
                status => assert_eq!(line["http_status"], status, "{line}"),
            }
            let failed = line["outcome"] != "done";
            assert_eq!(
                line.get("error").is_some(),
                failed,
                "an error on failures only: {line}"
            );
            let level = if line["outcome"] == "dead" { "WARN" } else { "INFO" };
            assert_eq!(line["level"], level, "{line}");
        }
    }
    assert!(calls.is_empty(), "lines for rows never enqueued: {calls:#?}");
    // The statuses the lines carry cover each case of the contract.
    assert_eq!(stats.key("conf-2").statuses[0], 503);
    assert_eq!(stats.key("ship-3").statuses[0], 0);
    assert_eq!(stats.key("refund-4").statuses[0], 422);
}
