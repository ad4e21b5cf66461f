//! Real processes and real signals: a relay SIGKILLed mid-call, a relay
//! stopped with SIGTERM.

use std::time::{Duration, Instant};

use crate::helpers::env;

/// The first relay dies holding leases with calls in flight; the second takes
/// the rows once the leases expire. Whatever the number of requests per key,
/// the downstream shows one effect per key.
#[tokio::test]
async fn a_killed_relays_rows_are_completed_by_another_after_the_lease() {
    let env = env().await;
    env.set_latency("1500").await;
    env.seed(1, 20).await;
    let lease = [
        ("RELAY_LEASE_SECS", "3"),
        ("RELAY_HTTP_TIMEOUT_MS", "2500"),
        ("RELAY_POLL_INTERVAL_MS", "100"),
    ];
    let first = env.spawn_relay(&lease);
    // Wait for its calls to be in flight, then kill it without warning.
    let started = Instant::now();
    while env
        .count("SELECT count(*) FROM outbox WHERE lease_owner IS NOT NULL")
        .await
        < 20
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the first relay never claimed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.signal("KILL");
    let killed_at = Instant::now();
    let _ = first.wait(Duration::from_secs(5));
    assert_eq!(
        env.count("SELECT count(*) FROM outbox WHERE status = 'done'")
            .await,
        0
    );

    env.set_latency("0").await;
    let second = env.spawn_relay(&lease);
    env.wait_for(
        "SELECT count(*) FROM outbox WHERE status = 'done'",
        20,
        Duration::from_secs(20),
    )
    .await;
    assert!(
        killed_at.elapsed() >= Duration::from_millis(1500),
        "rows were taken before their lease expired"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM outbox WHERE attempts <> 2").await,
        0,
        "each claimed twice"
    );
    let stats = env.stats().await;
    for (key, k) in stats.keys.as_ref().unwrap() {
        assert_eq!(
            k.effects, 1,
            "{key}: one effect whatever the number of requests ({})",
            k.requests
        );
    }
    assert_eq!(stats.effects, 20);
    assert_eq!(stats.double_effects, 0);
    second.signal("TERM");
    assert_eq!(second.wait(Duration::from_secs(10)).0, Some(0));
}

/// SIGTERM: stop claiming, finish the calls in flight, release the rest, exit
/// 0 within RELAY_HTTP_TIMEOUT_MS plus a second, leaving no row leased.
#[tokio::test]
async fn sigterm_exits_0_in_time_and_leaves_no_row_leased() {
    let env = env().await;
    env.set_latency("400").await;
    env.seed(1, 300).await;
    let relay = env.spawn_relay(&[
        ("RELAY_CONCURRENCY", "8"),
        ("RELAY_BATCH_SIZE", "20"),
        ("RELAY_HTTP_TIMEOUT_MS", "2000"),
        ("RELAY_POLL_INTERVAL_MS", "100"),
    ]);
    env.wait_for(
        "SELECT least(count(*), 8) FROM outbox WHERE status = 'done'",
        8,
        Duration::from_secs(20),
    )
    .await;
    let held = env
        .count("SELECT count(*) FROM outbox WHERE lease_owner IS NOT NULL")
        .await;
    assert!(held > 8, "calls in flight and rows waiting: {held}");
    relay.signal("TERM");
    let stopped = Instant::now();
    let (code, stderr) = relay.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stopped.elapsed() <= Duration::from_millis(3000),
        "exit within the HTTP timeout plus a second"
    );

    assert_eq!(
        env.count("SELECT count(*) FROM outbox WHERE lease_owner IS NOT NULL")
            .await,
        0
    );
    assert_eq!(
        env.count("SELECT count(*) FROM outbox WHERE status = 'pending' AND (available_at > now() OR leased_until IS NOT NULL)")
            .await,
        0,
        "released rows are due at once"
    );
    let done = env
        .count("SELECT count(*) FROM outbox WHERE status = 'done'")
        .await;
    let stats = env.stats().await;
    assert_eq!(
        stats.effects as i64, done,
        "every done row has its effect, and only those"
    );
    let unsent_attempts = env
        .count("SELECT count(*) FROM outbox WHERE status = 'pending' AND attempts <> 0")
        .await;
    assert_eq!(
        unsent_attempts, 0,
        "released rows were never sent, so no attempt counted"
    );
}
