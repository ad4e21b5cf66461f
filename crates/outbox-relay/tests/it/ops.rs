//! The operator's commands against a known state.

use std::process::Command;

use testkit::metrics::Metrics;

use crate::helpers::env;

mod prune;

pub(crate) fn relay_cli(url: &str, args: &[&str]) -> (bool, String, String) {
    testkit::run_cli(env!("CARGO_BIN_EXE_outbox-relay"), url, args)
}

#[tokio::test]
async fn stats_count_by_status_and_kind() {
    let env = env().await;
    env.seed(1, 5).await;
    env.enqueue("send_confirmation", 1, "evt_1").await;
    env.client
        .batch_execute(
            "UPDATE outbox SET status = 'done', finished_at = now() WHERE order_id IN (1, 2) AND kind = 'ship_order';
             UPDATE outbox SET status = 'dead', finished_at = now(), last_error = 'HTTP 400' WHERE order_id = 3;
             UPDATE outbox SET created_at = now() - interval '90 seconds' WHERE order_id = 4;
             UPDATE outbox SET available_at = now() + interval '1 hour' WHERE order_id = 5;
             UPDATE outbox SET lease_owner = 'relay-x', leased_until = now() + interval '1 minute'
              WHERE kind = 'send_confirmation';",
        )
        .await
        .unwrap();
    let (ok, out, err) = relay_cli(&env.relay_url, &["stats", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    // Pending: one due, one waiting to retry, one leased.
    assert_eq!(v["pending"], 3);
    assert_eq!(v["due"], 1);
    assert_eq!(v["dead"], 1);
    let age = v["oldest_pending_age_seconds"].as_f64().unwrap();
    assert!((89.0..120.0).contains(&age), "{age}");
    let find = |status: &str, kind: &str| {
        v["by_status_and_kind"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["status"] == status && r["kind"] == kind)
            .map(|r| r["count"].as_i64().unwrap())
    };
    assert_eq!(find("done", "ship_order"), Some(2));
    assert_eq!(find("dead", "ship_order"), Some(1));
    assert_eq!(find("pending", "ship_order"), Some(2));
    assert_eq!(find("pending", "send_confirmation"), Some(1));
    let (ok, table, _) = relay_cli(&env.relay_url, &["stats"]);
    assert!(ok && table.contains("oldest pending: 9"), "{table}");
    assert!(table.contains("pending: 3 (due now: 1)"), "{table}");
}

/// With nothing recorded, the commands say so: no age of a row that does not
/// exist, no bare table, and the window as it was given.
#[tokio::test]
async fn empty_states_read_as_empty() {
    let env = env().await;
    let (ok, out, err) = relay_cli(&env.relay_url, &["stats", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["pending"], 0);
    assert!(v["oldest_pending_age_seconds"].is_null(), "{out}");
    let (ok, table, _) = relay_cli(&env.relay_url, &["stats"]);
    assert!(ok && table.contains("oldest pending: -\n"), "{table}");
    let (ok, audit, _) = relay_cli(&env.relay_url, &["audit", "--since", "1h"]);
    assert!(ok, "{audit}");
    assert_eq!(
        audit,
        "Audit of the last 1h: no delivery received and no command enqueued\n"
    );
}

#[tokio::test]
async fn requeue_all_and_unknown_ids() {
    let env = env().await;
    env.seed(1, 3).await;
    env.client
        .batch_execute(
            "UPDATE outbox SET status = 'dead', attempts = 25, finished_at = now(), last_error = 'x'",
        )
        .await
        .unwrap();
    let (ok, _, err) = relay_cli(&env.relay_url, &["dead", "requeue", "999999"]);
    assert!(!ok && err.contains("999999"), "{err}");
    let (ok, out, err) = relay_cli(&env.relay_url, &["dead", "requeue", "--all"]);
    assert!(ok, "{err}");
    assert!(out.contains("requeued 3"), "{out}");
    assert_eq!(
        env.count(
            "SELECT count(*) FROM outbox WHERE status = 'pending' AND attempts = 0 AND available_at <= now()"
        )
        .await,
        3
    );
}

#[tokio::test]
async fn configuration_errors_name_the_variable() {
    let base = [
        ("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none"),
        ("FULFILMENT_URL", "http://127.0.0.1:1"),
        ("EMAIL_URL", "http://127.0.0.1:1"),
    ];
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);
    let cases: &[Case] = &[
        (&[("FULFILMENT_URL", "")], &["FULFILMENT_URL"]),
        (&[("EMAIL_URL", "not a url")], &["EMAIL_URL"]),
        (&[("RELAY_BATCH_SIZE", "0")], &["RELAY_BATCH_SIZE"]),
        (&[("RELAY_CONCURRENCY", "lots")], &["RELAY_CONCURRENCY"]),
        (&[("RELAY_POLL_INTERVAL_MS", "-5")], &["RELAY_POLL_INTERVAL_MS"]),
        (&[("RELAY_LISTEN", "maybe")], &["RELAY_LISTEN"]),
        (&[("RETENTION_DAYS", "0")], &["RETENTION_DAYS"]),
        (
            &[("RELAY_LEASE_SECS", "10"), ("RELAY_HTTP_TIMEOUT_MS", "10000")],
            &["RELAY_LEASE_SECS", "RELAY_HTTP_TIMEOUT_MS"],
        ),
    ];
    for (overrides, names) in cases {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default());
        for (k, v) in base.iter().chain(overrides.iter()) {
            cmd.env(k, v);
        }
        if overrides.iter().any(|(k, _)| *k == "FULFILMENT_URL") {
            cmd.env_remove("FULFILMENT_URL");
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{names:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
        for name in *names {
            assert!(stderr.contains(name), "{name} not named in {stderr:?}");
        }
        assert!(!stderr.contains("panicked"));
    }
}

/// The audit's figures against a workload whose duplicates are known.
#[tokio::test]
async fn audit_counts_a_known_workload() {
    let env = env().await;
    env.client
        .batch_execute(
            "INSERT INTO processed_events (event_id, event_type, status, result, deliveries)
             SELECT 'evt_' || n, 'payment.succeeded', 'processed', '{}', CASE WHEN n <= 10 THEN 3 ELSE 1 END
               FROM generate_series(1, 100) n;
             INSERT INTO processed_events (event_id, event_type, status, result, deliveries)
             VALUES ('evt_u', 'payment.succeeded', 'unmatched', '{}', 2);
             INSERT INTO processed_events (event_id, event_type, status, result, processed_at)
             VALUES ('evt_old', 'payment.succeeded', 'processed', '{}', now() - interval '3 days');",
        )
        .await
        .unwrap();
    env.seed(1, 100).await;
    env.client
        .batch_execute(
            "UPDATE outbox SET status = 'done', finished_at = now() WHERE order_id <= 95;
             UPDATE outbox SET status = 'dead', finished_at = now() WHERE order_id = 96;",
        )
        .await
        .unwrap();
    let (ok, out, err) = relay_cli(&env.relay_url, &["audit", "--since", "1d", "--json"]);
    assert!(ok, "{err}");
    let a: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(a["distinct_events"], 101);
    assert_eq!(a["deliveries"], 100 + 20 + 2);
    assert_eq!(a["duplicate_deliveries"], 21);
    assert_eq!(a["since_seconds"], 86_400);
    assert_eq!(a["double_enqueued"], 0);
    let commands = a["commands"].as_array().unwrap();
    let get = |status: &str| {
        commands
            .iter()
            .find(|r| r[0] == "ship_order" && r[1] == status)
            .map(|r| r[2].clone())
    };
    assert_eq!(get("done"), Some(95.into()));
    assert_eq!(get("dead"), Some(1.into()));
    assert_eq!(get("pending"), Some(4.into()));

    let (ok, table, _) = relay_cli(&env.relay_url, &["audit", "--since", "1d"]);
    assert!(ok);
    assert!(
        table.contains("duplicate deliveries") && table.contains("21"),
        "{table}"
    );
    assert!(
        table.contains("commands enqueued twice for one order: 0"),
        "{table}"
    );
    let (ok, _, err) = relay_cli(&env.relay_url, &["audit", "--downstream-stats", &env.url()]);
    assert!(
        !ok && err.contains("--downstream-stats"),
        "the relay reads no downstream: {err}"
    );
    let (ok, _, err) = relay_cli(&env.relay_url, &["audit", "--since", "soon"]);
    assert!(!ok && err.contains("soon"), "{err}");
}

/// Text a downstream or a sender wrote (last_error, keys, event ids) reaches
/// an operator's terminal escaped: no ESC, CR or bidi override byte.
#[tokio::test]
async fn tables_escape_terminal_controls() {
    let env = env().await;
    env.seed(1, 2).await;
    env.client
        .batch_execute(
            "UPDATE outbox SET status = 'dead', finished_at = now(),
                    last_error = E'HTTP 500 \\x1b[2J\\rowned \\u202e', idempotency_key = E'k\\x1b]0;x\\x07' || id
              WHERE order_id = 1;
             INSERT INTO processed_events (event_id, event_type, status, result)
             VALUES (E'evt_\\x1b[2J', E'payment.\\x1b[31m', 'processed', '{}');",
        )
        .await
        .unwrap();
    for args in [&["dead", "list"][..], &["stats"], &["audit", "--since", "1h"]] {
        let (ok, out, err) = relay_cli(&env.relay_url, args);
        assert!(ok, "{args:?}: {err}");
        assert!(
            !out.contains(['\x1b', '\r', '\x07', '\u{202e}']),
            "{args:?} printed a control character: {out:?}"
        );
    }
    let (_, out, _) = relay_cli(&env.relay_url, &["dead", "list"]);
    assert!(out.contains("HTTP 500 \\u{1b}[2J\\u{d}owned \\u{202e}"), "{out}");
    // The JSON keeps the text as it is (serde escapes it).
    let (_, json, _) = relay_cli(&env.relay_url, &["dead", "list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert_eq!(v["last_error"], "HTTP 500 \x1b[2J\rowned \u{202e}");
}

/// `dead requeue` without a row names both ways to name rows, as a usage
/// error with the `--help` to read.
#[test]
fn requeue_without_a_row_names_id_and_all() {
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["dead", "requeue"])
        .env_clear()
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("<ID|--all>"), "{stderr}");
    assert!(
        stderr
            .trim_end()
            .ends_with("(try `outbox-relay dead requeue --help`)"),
        "{stderr}"
    );
}
