//! `events show` and `events list` as an operator runs them: the binary, as
//! the ingest's own role (so the role's grants are shown to suffice), against
//! what real deliveries recorded.

use testkit::Role;

use crate::helpers::{SECRET, TestApp, event, now, spawn_app, standard_headers};

const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";

/// `webhook-ingest <args>` as the ingest's role: (success, stdout, stderr).
fn cli(app: &TestApp, args: &[&str]) -> (bool, String, String) {
    let url = app.db.as_ref().unwrap().url_as(Role::Ingest);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_webhook-ingest"))
        .args(args)
        .env("DATABASE_URL", url)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test]
async fn events_show_tells_an_events_deliveries_answer_trace_and_its_orders_commands() {
    let app = spawn_app().await;
    app.insert_order(1, "pay_1", "pending").await;
    let payment = event("evt_pay", "payment.succeeded", "pay_1");
    let mut headers = standard_headers(SECRET, now(), &payment);
    headers.push(("traceparent", format!("00-{TRACE_ID}-b7ad6b7169203331-01")));
    let first = app.post_with(&payment, &headers).await;
    assert_eq!(first.status(), 200);
    let answer: serde_json::Value = first.json().await.unwrap();
    assert_eq!(app.post(&payment).await.status(), 200, "a redelivery");
    assert_eq!(
        app.post(&event("evt_refund", "payment.refunded", "pay_1"))
            .await
            .status(),
        200
    );
    // What the relay did meanwhile: the confirmation delivered, the refund
    // notice retried twice and due again in a minute.
    app.client
        .batch_execute(
            "UPDATE outbox SET status = 'done', attempts = 1, finished_at = now()
              WHERE kind = 'send_confirmation';
             UPDATE outbox SET attempts = 2, last_error = 'HTTP 503: down for maintenance',
                    available_at = now() + interval '1 minute'
              WHERE kind = 'send_refund_notice';",
        )
        .await
        .unwrap();

    let (ok, out, err) = cli(&app, &["events", "show", "evt_pay", "--json"]);
    assert!(ok, "{err}");
    let story: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(story["event_id"], "evt_pay");
    assert_eq!(story["status"], "processed");
    assert_eq!(story["order_id"], 1);
    assert_eq!(story["deliveries"], 2);
    assert_eq!(
        story["result"], answer,
        "the stored answer, as every delivery got it"
    );
    assert_eq!(story["trace_id"], TRACE_ID);
    assert_eq!(story["payload"]["data"]["payment_id"], "pay_1");
    let commands = story["commands"].as_array().unwrap();
    let by_kind = |kind: &str| {
        commands
            .iter()
            .find(|c| c["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} in {commands:?}"))
    };
    assert_eq!(commands.len(), 3, "{commands:?}");
    let ship = by_kind("ship_order");
    assert_eq!(ship["status"], "cancelled", "the refund stopped it");
    assert_eq!(ship["event_id"], "evt_pay");
    assert_eq!(ship["idempotency_key"], "ship-1");
    assert!(ship["finished_at"].is_string());
    let confirmation = by_kind("send_confirmation");
    assert_eq!(
        (confirmation["status"].as_str(), confirmation["attempts"].as_i64()),
        (Some("done"), Some(1))
    );
    let notice = by_kind("send_refund_notice");
    assert_eq!(notice["event_id"], "evt_refund");
    assert_eq!(notice["attempts"], 2);
    assert_eq!(notice["last_error"], "HTTP 503: down for maintenance");
    assert!(notice["finished_at"].is_null());

    let (ok, table, err) = cli(&app, &["events", "show", "evt_pay"]);
    assert!(ok, "{err}");
    for expected in [
        "event        evt_pay",
        "status       processed",
        "deliveries   2: first ",
        &format!("trace        {TRACE_ID}"),
        "commands of order 1:",
        "HTTP 503: down for maintenance",
        "due ",
    ] {
        assert!(table.contains(expected), "`{expected}` missing from:\n{table}");
    }

    // An event no order matched has no commands, and says why.
    assert_eq!(
        app.post(&event("evt_lost", "payment.succeeded", "pay_404"))
            .await
            .status(),
        200
    );
    let (ok, table, err) = cli(&app, &["events", "show", "evt_lost"]);
    assert!(ok, "{err}");
    assert!(table.contains("status       unmatched"), "{table}");
    assert!(table.contains("no order matched"), "{table}");

    // An id never recorded: an error that says what may have happened, exit 1.
    let (ok, out, err) = cli(&app, &["events", "show", "evt_never"]);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(err.contains("no event `evt_never` recorded"), "{err}");
}

#[tokio::test]
async fn events_list_filters_by_id_and_age_and_pages_without_gaps_or_repeats() {
    let app = spawn_app().await;
    // 7 events of run A a second apart (newest first: a_7 .. a_1), one of
    // run B, one of run A two days old.
    app.client
        .batch_execute(
            "INSERT INTO processed_events (event_id, event_type, status, result, processed_at)
             SELECT 'evt_a_' || n, 'payment.succeeded', 'processed', '{}', now() - (10 - n) * interval '1 second'
               FROM generate_series(1, 7) n;
             INSERT INTO processed_events (event_id, event_type, status, result)
             VALUES ('evt_b_1', 'payment.succeeded', 'unmatched', '{}');
             INSERT INTO processed_events (event_id, event_type, status, result, processed_at)
             VALUES ('evt_a_old', 'payment.succeeded', 'processed', '{}', now() - interval '2 days');",
        )
        .await
        .unwrap();
    let ids = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["events", "list", "--json"];
        all.extend_from_slice(args);
        let (ok, out, err) = cli(&app, &all);
        assert!(ok, "{err}");
        out.lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["event_id"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };

    assert_eq!(ids(&["--id", "evt_b_1"]), ["evt_b_1"]);
    assert_eq!(ids(&["--id", "evt_a_*"]).len(), 8, "a prefix");
    assert_eq!(
        ids(&["--id", "evt_a_*", "--since", "1h"]).len(),
        7,
        "not the old one"
    );
    assert_eq!(ids(&["--status", "unmatched"]), ["evt_b_1"]);

    // Pages of three through run A's recent events: every one once, in order.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = vec!["--id", "evt_a_*", "--since", "1h", "--limit", "3"];
        if let Some(last) = &after {
            args.extend_from_slice(&["--after", last]);
        }
        let page = ids(&args);
        seen.extend(page.iter().cloned());
        if page.len() < 3 {
            break;
        }
        after = page.last().cloned();
    }
    let expected: Vec<String> = (1..=7).rev().map(|n| format!("evt_a_{n}")).collect();
    assert_eq!(seen, expected);

    // The table says how to get the next page.
    let (ok, table, err) = cli(&app, &["events", "list", "--id", "evt_a_*", "--limit", "2"]);
    assert!(ok, "{err}");
    assert!(table.contains("the next page: --after evt_a_6"), "{table}");

    let (ok, _, err) = cli(&app, &["events", "list", "--after", "evt_gone"]);
    assert!(!ok);
    assert!(err.contains("no event `evt_gone` to list after"), "{err}");
    let (ok, _, err) = cli(&app, &["events", "list", "--since", "soon"]);
    assert!(!ok);
    assert!(err.contains("soon"), "{err}");
}
