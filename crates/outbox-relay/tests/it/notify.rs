//! Waking: a NOTIFY on `db::NOTIFY_CHANNEL`, and recovery of every
//! connection the relay holds.

use std::time::{Duration, Instant};

use outbox_relay::startup::Application;
use tokio_util::sync::CancellationToken;

use crate::helpers::{Env, env};

/// The relay as the binary runs it, in process, with `extra` flags.
fn start(env: &Env, extra: &[&str]) -> (CancellationToken, tokio::task::JoinHandle<anyhow::Result<()>>) {
    let settings = env.cli(extra).settings;
    let app = Application::build(
        "127.0.0.1:0",
        &settings.database().unwrap(),
        None,
        4,
        settings.relay().unwrap(),
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(app.run_until_stopped(shutdown.clone()));
    (shutdown, task)
}

async fn wait_for_effect(env: &Env, key: &str, timeout: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let stats = env.stats().await;
        if stats
            .keys
            .as_ref()
            .and_then(|k| k.get(key))
            .is_some_and(|k| k.effects == 1)
        {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < timeout,
            "{key} not delivered within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// With polling every minute, only the NOTIFY can explain a prompt delivery.
#[tokio::test]
async fn an_idle_relay_delivers_a_new_row_within_a_second() {
    let env = env().await;
    let (shutdown, task) = start(&env, &["--relay-poll-interval-ms", "60000"]);
    // Let it claim once, find nothing and go idle on LISTEN.
    tokio::time::sleep(Duration::from_millis(700)).await;
    for order in 1..=3 {
        env.enqueue("ship_order", order, &format!("evt_{order}")).await;
        let took = wait_for_effect(&env, &format!("ship-{order}"), Duration::from_secs(1)).await;
        assert!(took < Duration::from_secs(1), "{took:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// Every connection of the relay killed by the server: the pool replaces its
/// connections, the listener reconnects, nothing is lost, no restart.
#[tokio::test]
async fn terminated_connections_are_recovered_without_a_restart() {
    let env = env().await;
    let (shutdown, task) = start(&env, &["--relay-poll-interval-ms", "60000"]);
    env.seed(1, 100).await;
    env.enqueue("ship_order", 1000, "evt_kick").await;
    env.wait_for(
        "SELECT count(*) FROM outbox WHERE status = 'done'",
        101,
        Duration::from_secs(10),
    )
    .await;

    let killed = env
        .count(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = current_database() AND application_name LIKE 'outbox-relay%') t",
        )
        .await;
    assert!(killed >= 2, "the pool and the LISTEN connection: {killed}");

    // New work announced by NOTIFY only (polling is a minute away): it gets
    // through once the listener is back, and the claim works on fresh connections.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for order in 2000..2010 {
        env.enqueue("send_confirmation", order, &format!("evt_{order}"))
            .await;
    }
    env.wait_for(
        "SELECT count(*) FROM outbox WHERE status = 'done'",
        111,
        Duration::from_secs(5),
    )
    .await;
    let stats = env.stats().await;
    assert_eq!(stats.effects, 111);
    assert_eq!(stats.double_effects, 0);
    shutdown.cancel();
    task.await.unwrap().unwrap();
}
