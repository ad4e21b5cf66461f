//! `make run` in a short mode: the incident replayed, then its audit checked.

use std::process::Command;

use testkit::TestDb;

#[tokio::test]
async fn make_run_replays_the_incident_with_no_double_effect() {
    let db = TestDb::new().await;
    let dir = std::env::temp_dir().join(format!("run-demo-{}", testkit::free_port()));
    let bin_dir = testkit::bin::path("webhook-ingest").parent().unwrap().to_owned();
    let out = Command::new(testkit::workspace_root().join("scripts/run.sh"))
        .env("DATABASE_URL", &db.url)
        .env("BIN_DIR", &bin_dir)
        .env("RUN_DIR", &dir)
        .env("RUN_EVENTS", "300")
        .env("RUN_RATE", "100")
        .env("RUN_DEGRADED_SECS", "2")
        .env("RUN_STALL_SECS", "1")
        .env(
            "INGEST_LISTEN_ADDR",
            format!("127.0.0.1:{}", testkit::free_port()),
        )
        .env("ADMIN_LISTEN_ADDR", format!("127.0.0.1:{}", testkit::free_port()))
        .env(
            "RELAY_ADMIN_LISTEN_ADDR",
            format!("127.0.0.1:{}", testkit::free_port()),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "run.sh failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("RESULT: exactly once"), "{stdout}");
    assert!(stdout.contains("double effects                 0"), "{stdout}");
    // Plain words and plain text: no Python spelling, no terminal codes in
    // a pipe, and the provider's deliveries reconciled with the database's.
    assert!(stdout.contains("every one acknowledged"), "{stdout}");
    assert!(
        !stdout.contains("True") && !stderr.contains('\x1b'),
        "{stdout}\n{stderr:?}"
    );
    for line in [
        "sent by the provider",
        "timed out at the provider",
        "received by the database",
    ] {
        assert!(stdout.contains(line), "no `{line}` in:\n{stdout}");
    }

    let audit: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("audit.json")).unwrap()).unwrap();
    let provider: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("provider.json")).unwrap()).unwrap();
    assert_eq!(audit["downstream"]["double_effects"], 0);
    assert_eq!(
        provider["acknowledged"], provider["events"],
        "the provider got a 2xx for every event"
    );
    assert_eq!(audit["distinct_events"], provider["events"]);
    // Duplicates are counted: every delivery that reached the ingest, however it ended for the provider.
    let deliveries = audit["deliveries"].as_i64().unwrap();
    let distinct = audit["distinct_events"].as_i64().unwrap();
    assert_eq!(
        audit["duplicate_deliveries"].as_i64().unwrap(),
        deliveries - distinct
    );
    assert!(
        audit["duplicate_deliveries"].as_i64().unwrap() >= provider["duplicate_deliveries"].as_i64().unwrap()
    );
    // Every accepted event's commands were delivered, once.
    let mut done = std::collections::HashMap::new();
    for row in audit["commands"].as_array().unwrap() {
        let (kind, status, n) = (
            row[0].as_str().unwrap(),
            row[1].as_str().unwrap(),
            row[2].as_i64().unwrap(),
        );
        assert!(
            status == "done" || status == "cancelled",
            "{kind} {status} {n}: nothing pending or dead"
        );
        if status == "done" {
            done.insert(kind.to_owned(), n);
        }
    }
    let processed = audit["events_by_status"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[0] == "processed")
        .map(|r| r[1].as_i64().unwrap())
        .unwrap();
    assert_eq!(done["ship_order"] + cancelled(&audit, "ship_order"), processed);
    // A shipment whose call was under way when its order's refund committed
    // may exist with its row cancelled (the one exception of the per-order
    // rules, docs/CONTRACT.md section 7): the downstream's shipments lie
    // between the rows done and those plus the cancelled ones, and the audit
    // counts the difference as allowed.
    let shipments = audit["downstream"]["shipments"].as_i64().unwrap();
    let under_way = audit["exactly_once"]["shipments_under_way"].as_i64().unwrap();
    let (shipped, ship_cancelled) = (done["ship_order"], cancelled(&audit, "ship_order"));
    assert!(
        (shipped..=shipped + ship_cancelled).contains(&shipments),
        "shipments {shipments}, rows done {shipped}, cancelled {ship_cancelled}"
    );
    assert_eq!(shipments - shipped, under_way);
    let _ = std::fs::remove_dir_all(&dir);
}

fn cancelled(audit: &serde_json::Value, kind: &str) -> i64 {
    audit["commands"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r[0] == kind && r[1] == "cancelled")
        .map(|r| r[2].as_i64().unwrap())
        .sum()
}
