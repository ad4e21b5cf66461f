//! Failures: retried with backoff under the same key and body, or dead.

use std::time::{Duration, Instant};

use outbox_relay::worker::{Pass, Relay};

use crate::helpers::{Env, env};

/// Runs `relay_once` until the row leaves `pending` or `timeout` passes,
/// returning the schedule seen after each attempt: (attempts, delay until due).
async fn drive(env: &Env, relay: &Relay, id: i64, timeout: Duration) -> Vec<(i32, f64)> {
    let started = Instant::now();
    let mut schedule = Vec::new();
    while env.row_status(id).await.0 == "pending" {
        if let Pass::Relayed(_) = relay.relay_once().await.unwrap() {
            let r = env
                .client
                .query_one(
                    "SELECT attempts, extract(epoch FROM available_at - now())::float8 AS due_in
                       FROM outbox WHERE id = $1",
                    &[&id],
                )
                .await
                .unwrap();
            schedule.push((r.get("attempts"), r.get("due_in")));
        }
        assert!(
            started.elapsed() < timeout,
            "row {id} still pending after {timeout:?}: {schedule:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    schedule
}

#[tokio::test]
async fn a_500_500_200_sequence_is_done_after_three_attempts_with_one_key_and_one_body() {
    let env = env().await;
    let id = env.enqueue("ship_order", 7, "evt_7").await;
    env.script("ship-7", serde_json::json!([500, 500, 200])).await;
    let relay = env.relay(&["--relay-backoff-base-ms", "300", "--relay-backoff-max-secs", "5"]);

    // After each failure, the row waits out its backoff: due no earlier than
    // now, no later than the jitter's ceiling (300 ms, then 600 ms).
    let first = relay.relay_once().await.unwrap();
    assert_eq!(first, Pass::Relayed(1));
    let (status, attempts, error) = env.row_status(id).await;
    assert_eq!((status.as_str(), attempts), ("pending", 1));
    assert!(error.as_deref().unwrap().starts_with("HTTP 500"), "{error:?}");
    let due_in: f64 = env
        .client
        .query_one(
            "SELECT extract(epoch FROM available_at - now())::float8 AS due_in FROM outbox WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get("due_in");
    assert!(
        (-0.1..=0.31).contains(&due_in),
        "first backoff within [0, 300 ms]: {due_in}"
    );
    let lease_owner: Option<String> = env
        .client
        .query_one("SELECT lease_owner FROM outbox WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get("lease_owner");
    assert_eq!(lease_owner, None, "a rescheduled row is no longer leased");

    let schedule = drive(&env, &relay, id, Duration::from_secs(10)).await;
    assert_eq!(schedule.last().unwrap().0, 3, "{schedule:?}");
    let (status, attempts, error) = env.row_status(id).await;
    assert_eq!((status.as_str(), attempts, error), ("done", 3, None));

    let stats = env.stats().await;
    let key = stats.key("ship-7");
    assert_eq!(key.requests, 3);
    assert_eq!(key.effects, 1);
    assert_eq!(key.statuses, [500, 500, 201]);
    assert_eq!(key.bodies.len(), 3);
    assert!(
        key.bodies.iter().all(|b| b == &key.bodies[0]),
        "one body: {:?}",
        key.bodies
    );
    let traces: std::collections::HashSet<_> = key.traceparents.iter().map(|t| t.split('-').nth(1)).collect();
    assert_eq!(traces.len(), 1, "every attempt in the event's trace");
}

#[tokio::test]
async fn a_400_is_dead_at_once_and_requeue_delivers_it() {
    let env = env().await;
    let id = env.enqueue("send_confirmation", 3, "evt_3").await;
    env.script("conf-3", serde_json::json!([400])).await;
    let relay = env.relay(&[]);
    assert_eq!(relay.relay_once().await.unwrap(), Pass::Relayed(1));
    let (status, attempts, error) = env.row_status(id).await;
    assert_eq!((status.as_str(), attempts), ("dead", 1));
    assert!(error.as_deref().unwrap().starts_with("HTTP 400"), "{error:?}");
    assert_eq!(
        relay.relay_once().await.unwrap(),
        Pass::Empty,
        "dead rows are not claimed"
    );

    let list = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["dead", "list", "--json"])
        .env("DATABASE_URL", &env.relay_url)
        .output()
        .unwrap();
    assert!(list.status.success(), "{}", String::from_utf8_lossy(&list.stderr));
    let line: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(line["id"], id);
    assert_eq!(line["idempotency_key"], "conf-3");
    assert_eq!(line["kind"], "send_confirmation");
    assert_eq!(line["attempts"], 1);
    assert!(line["last_error"].as_str().unwrap().contains("400"));
    assert!(
        line["age"].as_f64().is_some_and(|a| (0.0..60.0).contains(&a)),
        "age in seconds: {line}"
    );

    let requeue = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["dead", "requeue", &id.to_string()])
        .env("DATABASE_URL", &env.relay_url)
        .output()
        .unwrap();
    assert!(
        requeue.status.success(),
        "{}",
        String::from_utf8_lossy(&requeue.stderr)
    );
    let (status, attempts, _) = env.row_status(id).await;
    assert_eq!((status.as_str(), attempts), ("pending", 0));

    assert_eq!(relay.relay_once().await.unwrap(), Pass::Relayed(1));
    assert_eq!(env.row_status(id).await.0, "done");
    let stats = env.stats().await;
    assert_eq!(
        (stats.key("conf-3").requests, stats.key("conf-3").effects),
        (2, 1)
    );
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let env = env().await;
    let id = env.enqueue("ship_order", 4, "evt_4").await;
    env.script("ship-4", serde_json::json!([429])).await;
    // Backoff base of 1 ms: any delay near a second comes from Retry-After (1 s).
    let relay = env.relay(&["--relay-backoff-base-ms", "1"]);
    relay.relay_once().await.unwrap();
    let due_in: f64 = env
        .client
        .query_one(
            "SELECT extract(epoch FROM available_at - now())::float8 AS due_in FROM outbox WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get("due_in");
    assert!(
        (0.8..=1.05).contains(&due_in),
        "Retry-After: 1 -> due in ~1 s, got {due_in}"
    );
    assert!(env.row_status(id).await.2.unwrap().starts_with("HTTP 429"));
}

#[tokio::test]
async fn after_max_attempts_a_row_is_dead_with_its_last_error() {
    let env = env().await;
    let id = env.enqueue("ship_order", 5, "evt_5").await;
    env.script("ship-5", serde_json::json!([503, 502])).await;
    let relay = env.relay(&["--relay-max-attempts", "2", "--relay-backoff-base-ms", "10"]);
    drive(&env, &relay, id, Duration::from_secs(5)).await;
    let (status, attempts, error) = env.row_status(id).await;
    assert_eq!((status.as_str(), attempts), ("dead", 2));
    let error = error.unwrap();
    assert!(
        error.contains("gave up after 2 attempts") && error.contains("HTTP 502"),
        "{error}"
    );
    assert_eq!(env.stats().await.key("ship-5").effects, 0);
}

/// A call that times out is retried with the same key: the downstream, which
/// did the work the first time, replays it instead of doing it again.
#[tokio::test]
async fn timeouts_and_resets_are_retried_and_the_key_keeps_the_effect_single() {
    let env = env().await;
    let hung = env.enqueue("ship_order", 8, "evt_8").await;
    let reset = env.enqueue("ship_order", 9, "evt_9").await;
    env.script("ship-8", serde_json::json!(["hang"])).await;
    env.script("ship-9", serde_json::json!(["reset"])).await;
    let relay = env.relay(&[
        "--relay-http-timeout-ms",
        "300",
        "--relay-lease-secs",
        "5",
        "--relay-backoff-base-ms",
        "10",
    ]);
    relay.relay_once().await.unwrap();
    let (status, attempts, error) = env.row_status(hung).await;
    assert_eq!((status.as_str(), attempts), ("pending", 1));
    assert!(error.as_deref().unwrap().starts_with("timeout"), "{error:?}");
    let (_, _, error) = env.row_status(reset).await;
    assert!(error.as_deref().unwrap().contains("connection"), "{error:?}");

    drive(&env, &relay, hung, Duration::from_secs(5)).await;
    drive(&env, &relay, reset, Duration::from_secs(5)).await;
    assert_eq!(env.row_status(hung).await.0, "done");
    assert_eq!(env.row_status(reset).await.0, "done");
    let stats = env.stats().await;
    for key in ["ship-8", "ship-9"] {
        assert_eq!(stats.key(key).requests, 2, "{key}");
        assert_eq!(
            stats.key(key).effects,
            1,
            "{key}: one effect whatever the number of requests"
        );
    }
}

/// Rows waiting for a call slot while calls are slow would outlive their
/// lease: they are handed back unsent (and claimed again later, under a new
/// lease), so no row is ever sent under an expired lease, and no attempt is
/// spent on a send that never happened.
#[tokio::test]
async fn rows_are_released_rather_than_sent_when_their_lease_runs_short() {
    let env = env().await;
    env.seed(1, 5).await;
    env.set_latency("600").await;
    // Lease 3 s, calls up to 2.2 s: after two 600 ms calls, the rest of a
    // batch no longer has the lease to be sent.
    let relay = env.relay(&[
        "--relay-concurrency",
        "1",
        "--relay-batch-size",
        "5",
        "--relay-lease-secs",
        "3",
        "--relay-http-timeout-ms",
        "2200",
    ]);
    assert_eq!(relay.relay_once().await.unwrap(), Pass::Relayed(5));
    let done = env
        .count("SELECT count(*) FROM outbox WHERE status = 'done'")
        .await;
    assert!(
        (1..5).contains(&done),
        "some sent, the rest released: {done} done"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM outbox WHERE status = 'pending' AND (attempts <> 0 OR lease_owner IS NOT NULL)")
            .await,
        0,
        "released rows: attempt undone, lease cleared"
    );
    let started = Instant::now();
    while env
        .count("SELECT count(*) FROM outbox WHERE status = 'done'")
        .await
        < 5
    {
        relay.relay_once().await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(20));
    }
    let stats = env.stats().await;
    for (key, k) in stats.keys.as_ref().unwrap() {
        assert_eq!((k.requests, k.effects), (1, 1), "{key}: sent once");
    }
    assert_eq!(
        env.count("SELECT count(*) FROM outbox WHERE attempts <> 1").await,
        0
    );
}
