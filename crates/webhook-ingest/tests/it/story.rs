//! `events show`, `events list` and `events replay` as an operator runs
//! them: the binary, as the ingest's own role (so the role's grants are shown
//! to suffice), against what real deliveries recorded.

use testkit::Role;
use webhook_ingest::storage;

use crate::helpers::{SECRET, TestApp, event, now, spawn_app, standard_headers};

const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";

/// `webhook-ingest <args>` as the ingest's role: (success, stdout, stderr).
fn cli(app: &TestApp, args: &[&str]) -> (bool, String, String) {
    let url = app.db.as_ref().unwrap().url_as(Role::Ingest);
    testkit::run_cli(env!("CARGO_BIN_EXE_webhook-ingest"), &url, args)
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

/// `events replay <id>` as the ingest's role: (success, stdout, stderr).
async fn replay(app: &TestApp, id: &str) -> (bool, String, String) {
    let url = app.db.as_ref().unwrap().url_as(Role::Ingest);
    let id = id.to_owned();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_webhook-ingest"))
            .args(["events", "replay", &id])
            .env("DATABASE_URL", url)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    })
    .await
    .unwrap()
}

/// Events the app's reconciler applied (`webhook_unmatched_applied_total`):
/// it races every replay below, as it would in production.
async fn reconciled(app: &TestApp) -> f64 {
    app.metrics().await.get("webhook_unmatched_applied_total", &[])
}

/// A payment that arrived before its order (unmatched) is applied once the
/// order exists, exactly once however many replays, redeliveries of it,
/// other payments of the order and the ingest's own reconciler race: one
/// event pays the order, its two commands are enqueued once, and exactly one
/// replay (or the reconciler) applied the event.
#[tokio::test]
async fn a_replayed_unmatched_payment_pays_its_order_once_whatever_races_it() {
    let app = spawn_app().await;
    let early = event("evt_early", "payment.succeeded", "pay_7");
    let first = app.post(&early).await;
    let unmatched: serde_json::Value = first.json().await.unwrap();
    assert_eq!(unmatched["status"], "unmatched");

    let (ok, out, err) = replay(&app, "evt_early").await;
    assert!(!ok, "{out}");
    assert!(err.contains("no order has payment id `pay_7` yet"), "{err}");
    assert_eq!(app.count("SELECT count(*) FROM outbox").await, 0);

    // The shop creates the order; then, at once: eight replays, eight
    // redeliveries of the early payment, and another payment of the order.
    app.insert_order(7, "pay_7", "pending").await;
    let replays: Vec<_> = (0..8).map(|_| replay(&app, "evt_early")).collect();
    let redeliveries: Vec<_> = (0..8).map(|_| app.post(&early)).collect();
    let later = event("evt_later", "payment.succeeded", "pay_7");
    let other = app.post(&later);
    let (replays, redeliveries, other) = tokio::join!(
        futures_util::future::join_all(replays),
        futures_util::future::join_all(redeliveries),
        other
    );
    assert_eq!(other.status(), 200);
    let mut applied = 0;
    for (ok, out, err) in &replays {
        assert!(ok, "every replay succeeds: {out}{err}");
        if out.starts_with("replayed evt_early") {
            applied += 1;
        } else {
            assert!(out.starts_with("unchanged: evt_early is "), "{out}");
        }
    }
    let by_reconciler = reconciled(&app).await;
    assert_eq!(
        applied as f64 + by_reconciler,
        1.0,
        "exactly one replay or the reconciler ({by_reconciler}) applied the event: {replays:?}"
    );
    let early_now: serde_json::Value = serde_json::from_str(
        &app.client
            .query_one(
                "SELECT result::text FROM processed_events WHERE event_id = 'evt_early'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, String>(0),
    )
    .unwrap();
    for r in redeliveries {
        assert_eq!(r.status(), 200);
        let body: serde_json::Value = r.json().await.unwrap();
        assert!(body == unmatched || body == early_now, "{body}");
    }

    // The order: paid once, by one of the two events; one shipment, one
    // confirmation, enqueued by that event.
    assert_eq!(app.order_status(7).await, "paid");
    let statuses: Vec<(String, String)> = app
        .text_pairs("SELECT event_id, status FROM processed_events ORDER BY event_id")
        .await;
    let payer: Vec<&str> = statuses
        .iter()
        .filter(|(_, s)| s == "processed")
        .map(|(e, _)| e.as_str())
        .collect();
    assert_eq!(payer.len(), 1, "one event paid the order: {statuses:?}");
    assert!(
        statuses
            .iter()
            .all(|(_, s)| s == "processed" || s == "already_paid"),
        "{statuses:?}"
    );
    let commands: Vec<(String, String)> = app
        .text_pairs("SELECT kind, event_id FROM outbox ORDER BY kind")
        .await;
    assert_eq!(
        commands,
        [
            ("send_confirmation".to_owned(), payer[0].to_owned()),
            ("ship_order".to_owned(), payer[0].to_owned())
        ]
    );
    assert_eq!(
        app.count("SELECT deliveries::int8 FROM processed_events WHERE event_id = 'evt_early'")
            .await,
        9,
        "every delivery counted"
    );

    // Once more, later: nothing changes, and it says so.
    let (ok, out, err) = replay(&app, "evt_early").await;
    assert!(ok, "{err}");
    assert!(out.starts_with("unchanged: evt_early is "), "{out}");
    assert_eq!(app.count("SELECT count(*) FROM outbox").await, 2);
}

/// A refund that arrived before its order is replayed as a refund: the order
/// refunded, its shipment not yet sent stopped, one refund notice.
#[tokio::test]
async fn a_replayed_unmatched_refund_refunds_and_stops_the_shipment() {
    let app = spawn_app().await;
    let (status, refund_answer) = {
        let r = app
            .post(&event("evt_refund_early", "payment.refunded", "pay_8"))
            .await;
        (r.status(), r.json::<serde_json::Value>().await.unwrap())
    };
    assert_eq!(
        (status.as_u16(), refund_answer["status"].as_str()),
        (200, Some("unmatched"))
    );
    app.insert_order(8, "pay_8", "pending").await;
    assert_eq!(
        app.post(&event("evt_pay_8", "payment.succeeded", "pay_8"))
            .await
            .status(),
        200
    );

    // The replay, or the reconciler before it.
    let (ok, out, err) = replay(&app, "evt_refund_early").await;
    assert!(ok, "{err}");
    assert!(
        out.starts_with("replayed evt_refund_early: refunded, order 8, 1 command(s) enqueued")
            || out.starts_with("unchanged: evt_refund_early is refunded (order 8)"),
        "{out}"
    );
    assert_eq!(app.order_status(8).await, "refunded");
    let rows: Vec<(String, String)> = app
        .text_pairs("SELECT kind, status FROM outbox ORDER BY kind")
        .await;
    assert_eq!(
        rows,
        [
            ("send_confirmation".to_owned(), "pending".to_owned()),
            ("send_refund_notice".to_owned(), "pending".to_owned()),
            ("ship_order".to_owned(), "cancelled".to_owned()),
        ]
    );
    // A later delivery of the refund is answered with what it did.
    let again = app
        .post(&event("evt_refund_early", "payment.refunded", "pay_8"))
        .await;
    let body: serde_json::Value = again.json().await.unwrap();
    assert_eq!(body["status"], "refunded");
    assert_eq!(body["order_id"], 8);
}

/// The statement's own guarantee, with no command-line check before it:
/// replays that all start while the event's row is held (a barrier: each
/// waits for its lock) apply it once, and the rest apply nothing.
#[tokio::test]
async fn replays_released_together_apply_the_event_once() {
    let app = spawn_app().await;
    let body = event("evt_racing", "payment.succeeded", "pay_9");
    assert_eq!(app.post(&body).await.status(), 200);
    // The row is held before its order exists: otherwise the app's reconciler
    // may apply the event first, and then no replay waits for the row.
    let holder = crate::helpers::hold_event_row(&app, "evt_racing").await;
    app.insert_order(9, "pay_9", "pending").await;
    let parsed = std::sync::Arc::new(domain::ProviderEvent::parse(body.as_bytes()).unwrap());
    let pool = db::Database::parse(&app.db.as_ref().unwrap().url_as(Role::Ingest))
        .unwrap()
        .pool(&db::ConnectOptions {
            application_name: "replay-race",
            statement_timeout: Some(std::time::Duration::from_secs(30)),
            lock_timeout: None,
            abort_when_client_leaves: false,
            asynchronous_commit: false,
            generic_plans: false,
            index_paths: false,
            pool_size: 8,
            pool_wait: std::time::Duration::from_secs(10),
        });

    let racers: Vec<_> = (0..8)
        .map(|_| {
            let (pool, parsed) = (pool.clone(), parsed.clone());
            tokio::spawn(async move {
                let client = pool.get().await.unwrap();
                storage::replay_event(&client, &parsed).await.unwrap()
            })
        })
        .collect();
    // Every replay waits for the row's lock before it is released.
    let waiting = "SELECT count(*) FROM pg_stat_activity
                    WHERE application_name = 'replay-race' AND wait_event_type = 'Lock'";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while app.count(waiting).await < 8 {
        assert!(
            std::time::Instant::now() < deadline,
            "the 8 replays never all waited for the held row"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    holder.batch_execute("COMMIT").await.unwrap();
    drop(holder);

    let mut applied = Vec::new();
    for racer in racers {
        if let Some(replayed) = racer.await.unwrap() {
            applied.push(replayed);
        }
    }
    // The app's reconciler raced them too (a ninth waiter on the row).
    let by_reconciler = reconciled(&app).await;
    assert_eq!(
        applied.len() as f64 + by_reconciler,
        1.0,
        "{applied:?}, reconciler {by_reconciler}"
    );
    if let Some(applied) = applied.first() {
        assert_eq!(applied.status, domain::EventOutcome::Processed);
        assert_eq!(applied.enqueued, 2);
    }
    assert_eq!(app.count("SELECT count(*) FROM outbox").await, 2);
    assert_eq!(app.order_status(9).await, "paid");
}
