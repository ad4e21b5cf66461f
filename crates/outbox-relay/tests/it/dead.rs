//! The dead letters, as an operator handles them: `dead list` (by kind, in
//! pages), `dead show`, `dead requeue` (dry or not), `dead discard`; each run
//! as the binary against a real database, as the relay's own role.

use crate::helpers::{Env, TRACEPARENT, env};
use crate::ops::relay_cli;

/// Five dead shipments (orders 1..5) and two dead confirmations (orders 1, 2),
/// and one pending shipment (order 6).
async fn dead_rows(env: &Env) {
    env.seed(1, 6).await;
    env.enqueue("send_confirmation", 1, "evt_1").await;
    env.enqueue("send_confirmation", 2, "evt_2").await;
    env.client
        .batch_execute(
            "UPDATE outbox SET status = 'dead', attempts = 25, finished_at = now(),
                    last_error = 'HTTP 400: ' || kind || ' ' || order_id
              WHERE order_id <> 6",
        )
        .await
        .unwrap();
}

fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out.trim()).unwrap()
}

async fn id_of(env: &Env, kind: &str, order: i64) -> i64 {
    env.count(&format!(
        "SELECT id FROM outbox WHERE kind = '{kind}' AND order_id = {order}"
    ))
    .await
}

#[tokio::test]
async fn dead_list_filters_by_kind_and_pages_through_every_row_once() {
    let env = env().await;
    dead_rows(&env).await;

    let (ok, out, err) = relay_cli(&env.relay_url, &["dead", "list"]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 1 + 7 + 1, "{out}");
    assert!(out.ends_with("(7 dead in all)\n"), "{out}");

    // Pages of two shipments: the table names the flag for the next page.
    let mut seen: Vec<i64> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = vec!["dead", "list", "--kind", "ship_order", "--limit", "2"];
        if let Some(after) = &after {
            args.extend(["--after", after.as_str()]);
        }
        let (ok, out, err) = relay_cli(&env.relay_url, &args);
        assert!(ok, "{err}");
        let ids: Vec<i64> = out
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect();
        assert!(ids.len() <= 2, "{out}");
        seen.extend(&ids);
        let footer = out.lines().last().unwrap();
        match footer.split("--after ").nth(1) {
            Some(next) => {
                assert!(footer.contains("5 dead of kind ship_order in all"), "{footer}");
                after = Some(next.trim_end_matches(')').to_owned());
            }
            None => break,
        }
    }
    let mut expected: Vec<i64> = Vec::new();
    for order in 1..=5 {
        expected.push(id_of(&env, "ship_order", order).await);
    }
    assert_eq!(seen, expected, "every dead shipment once, oldest first");

    // JSON: one object per row, with the columns an operator acts on.
    let (ok, out, err) = relay_cli(
        &env.relay_url,
        &["dead", "list", "--kind", "send_confirmation", "--json"],
    );
    assert!(ok, "{err}");
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 2, "{out}");
    assert_eq!(rows[0]["kind"], "send_confirmation");
    assert_eq!(rows[0]["order_id"], 1);
    assert_eq!(rows[0]["event_id"], "evt_1");
    assert_eq!(rows[0]["attempts"], 25);
    assert_eq!(rows[0]["last_error"], "HTTP 400: send_confirmation 1");
    assert!(rows[0]["finished_at"].is_string(), "{out}");

    let (ok, out, _) = relay_cli(&env.relay_url, &["dead", "list", "--kind", "nothing_like_it"]);
    assert!(
        ok && out.contains("(no dead rows of kind nothing_like_it)"),
        "{out}"
    );
    let (ok, _, err) = relay_cli(&env.relay_url, &["dead", "list", "--limit", "0"]);
    assert!(!ok && err.contains("--limit"), "{err}");
}

#[tokio::test]
async fn dead_show_tells_a_rows_whole_story() {
    let env = env().await;
    dead_rows(&env).await;
    let id = id_of(&env, "ship_order", 3).await;

    let (ok, out, err) = relay_cli(&env.relay_url, &["dead", "show", &id.to_string()]);
    assert!(ok, "{err}");
    for expected in [
        format!("row          {id}"),
        "kind         ship_order".to_owned(),
        "key          ship-3".to_owned(),
        "status       dead".to_owned(),
        "order        3".to_owned(),
        "event        evt_3 (enqueued it)".to_owned(),
        "attempts     25".to_owned(),
        "last error   HTTP 400: ship_order 3".to_owned(),
        "trace        4bf92f3577b34da6a3ce929d0e0e4736".to_owned(),
        r#"payload      {"v": 1, "event_id": "evt_3", "order_id": 3}"#.to_owned(),
    ] {
        assert!(out.contains(&expected), "no `{expected}` in:\n{out}");
    }
    assert!(out.contains("finished     "), "{out}");

    let (ok, out, err) = relay_cli(&env.relay_url, &["dead", "show", &id.to_string(), "--json"]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(v["status"], "dead");
    assert_eq!(v["payload"]["order_id"], 3);
    assert_eq!(v["trace_context"], TRACEPARENT);
    assert_eq!(v["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert!(v["finished_at"].is_string() && v["lease_owner"].is_null(), "{v}");

    // Any row can be shown; one not recorded is an error.
    let pending = id_of(&env, "ship_order", 6).await;
    let (ok, out, _) = relay_cli(&env.relay_url, &["dead", "show", &pending.to_string()]);
    assert!(
        ok && out.contains("status       pending") && out.contains("due "),
        "{out}"
    );
    let (ok, _, err) = relay_cli(&env.relay_url, &["dead", "show", "999999"]);
    assert!(!ok && err.contains("no outbox row 999999"), "{err}");
}

#[tokio::test]
async fn dead_requeue_dry_run_names_the_rows_and_changes_nothing() {
    let env = env().await;
    dead_rows(&env).await;
    let before = "SELECT count(*) FROM outbox WHERE status = 'dead' AND attempts = 25";

    let (ok, out, err) = relay_cli(&env.relay_url, &["dead", "requeue", "--all", "--dry-run"]);
    assert!(ok, "{err}");
    assert_eq!(out.matches("would requeue ").count(), 7, "{out}");
    assert!(
        out.contains("dry run: 7 row(s) would be requeued; nothing changed"),
        "{out}"
    );
    assert_eq!(env.count(before).await, 7);

    // Only one kind, for real: exactly the rows the dry run of it names.
    let args = [
        "dead",
        "requeue",
        "--all",
        "--kind",
        "send_confirmation",
        "--json",
    ];
    let (ok, dry, err) = relay_cli(&env.relay_url, &[&args[..], &["--dry-run"]].concat());
    assert!(ok, "{err}");
    let dry = json(&dry);
    assert_eq!(
        (dry["dry_run"].clone(), dry["count"].clone()),
        (true.into(), 2.into())
    );
    assert_eq!(env.count(before).await, 7);
    let (ok, out, err) = relay_cli(&env.relay_url, &args);
    assert!(ok, "{err}");
    let done = json(&out);
    assert_eq!(done["dry_run"], false);
    assert_eq!(
        done["rows"], dry["rows"],
        "the dry run named what the requeue did"
    );
    assert_eq!(done["rows"][0]["attempts"], 25, "as it was before the requeue");
    assert_eq!(
        env.count(
            "SELECT count(*) FROM outbox WHERE kind = 'send_confirmation' AND status = 'pending'
                AND attempts = 0 AND available_at <= now() AND finished_at IS NULL"
        )
        .await,
        2
    );
    assert_eq!(
        env.count("SELECT count(*) FROM outbox WHERE status = 'dead'")
            .await,
        5
    );

    // One row; a row not dead, or not there, is an error that changes nothing.
    let id = id_of(&env, "ship_order", 1).await;
    let (ok, out, err) = relay_cli(&env.relay_url, &["dead", "requeue", &id.to_string()]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!(
            "requeued {id} ship_order ship-1 (after 25 attempts; last error: HTTP 400: ship_order 1)"
        )),
        "{out}"
    );
    let (ok, _, err) = relay_cli(&env.relay_url, &["dead", "requeue", &id.to_string()]);
    assert!(
        !ok && err.contains("is pending, not dead: nothing changed"),
        "{err}"
    );
    let (ok, _, err) = relay_cli(&env.relay_url, &["dead", "requeue", "999999"]);
    assert!(!ok && err.contains("no outbox row 999999"), "{err}");
    let (ok, _, err) = relay_cli(&env.relay_url, &["dead", "requeue", "--kind", "ship_order"]);
    assert!(!ok && err.contains("--all"), "--kind without --all: {err}");
}

#[tokio::test]
async fn dead_discard_ends_a_dead_row_as_cancelled_with_the_reason_and_nothing_else() {
    let env = env().await;
    dead_rows(&env).await;
    let id = id_of(&env, "send_confirmation", 2).await;
    let reason = "customer confirmed by phone; ticket OPS-7";

    let (ok, out, err) = relay_cli(
        &env.relay_url,
        &["dead", "discard", &id.to_string(), "--reason", reason],
    );
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!(
            "discarded {id} send_confirmation conf-2 (order 2, event evt_2, after 25 attempts): dead -> cancelled"
        )),
        "{out}"
    );
    let (status, attempts, error) = env.row_status(id).await;
    assert_eq!((status.as_str(), attempts), ("cancelled", 25));
    assert_eq!(
        error.as_deref(),
        Some(
            "discarded by an operator: customer confirmed by phone; ticket OPS-7 (it died of: HTTP 400: send_confirmation 2)"
        )
    );
    assert_eq!(
        env.count("SELECT count(*) FROM outbox WHERE status = 'dead'")
            .await,
        6
    );

    // Once: a second discard, or a requeue, finds it not dead.
    let (ok, _, err) = relay_cli(
        &env.relay_url,
        &["dead", "discard", &id.to_string(), "--reason", "again"],
    );
    assert!(
        !ok && err.contains("is cancelled, not dead: nothing changed"),
        "{err}"
    );
    let (ok, _, err) = relay_cli(&env.relay_url, &["dead", "requeue", &id.to_string()]);
    assert!(!ok && err.contains("is cancelled, not dead"), "{err}");
    // A pending row is never discarded; a reason is required.
    let pending = id_of(&env, "ship_order", 6).await;
    let (ok, _, err) = relay_cli(
        &env.relay_url,
        &["dead", "discard", &pending.to_string(), "--reason", "x"],
    );
    assert!(!ok && err.contains("is pending, not dead"), "{err}");
    assert_eq!(env.row_status(pending).await.0, "pending");
    let other = id_of(&env, "ship_order", 4).await;
    for bad in [&["--reason", "  "][..], &[]] {
        let (ok, _, err) = relay_cli(
            &env.relay_url,
            &[&["dead", "discard", &other.to_string()][..], bad].concat(),
        );
        assert!(!ok && err.contains("reason"), "{bad:?}: {err}");
    }
    assert_eq!(env.row_status(other).await.0, "dead");

    // JSON says what it changed; the audit counts it cancelled.
    let (ok, out, err) = relay_cli(
        &env.relay_url,
        &[
            "dead",
            "discard",
            &other.to_string(),
            "--reason",
            "duplicate order",
            "--json",
        ],
    );
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(
        (v["id"].as_i64(), v["status"].as_str()),
        (Some(other), Some("cancelled"))
    );
    assert_eq!(v["idempotency_key"], "ship-4");
    let (ok, audit, err) = relay_cli(&env.relay_url, &["audit", "--since", "1h", "--json"]);
    assert!(ok, "{err}");
    let audit = json(&audit);
    let cancelled: i64 = audit["commands"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c[1] == "cancelled")
        .map(|c| c[2].as_i64().unwrap())
        .sum();
    assert_eq!(cancelled, 2, "{audit}");
}

/// A requeue and a discard of the same row at the same time: one of them
/// changes it, the other says it was not dead, and the row ends as the one
/// that succeeded says.
#[tokio::test]
async fn a_racing_requeue_and_discard_change_a_row_once_and_say_which() {
    let env = env().await;
    env.seed(1, 8).await;
    env.client
        .batch_execute("UPDATE outbox SET status = 'dead', finished_at = now(), last_error = 'x'")
        .await
        .unwrap();
    for order in 1..=8 {
        let id = id_of(&env, "ship_order", order).await.to_string();
        let url = env.relay_url.clone();
        let (requeue, discard) = std::thread::scope(|s| {
            let requeue = s.spawn(|| relay_cli(&url, &["dead", "requeue", &id]));
            let discard = s.spawn(|| relay_cli(&url, &["dead", "discard", &id, "--reason", "race"]));
            (requeue.join().unwrap(), discard.join().unwrap())
        });
        assert!(
            requeue.0 != discard.0,
            "exactly one succeeds: {requeue:?} {discard:?}"
        );
        let status = env.row_status(id.parse().unwrap()).await.0;
        let expected = if requeue.0 { "pending" } else { "cancelled" };
        assert_eq!(status, expected, "{requeue:?} {discard:?}");
    }
}
