//! Each command reaches the right API with the right key, body and trace, once.

use std::time::Duration;

use outbox_relay::worker::Pass;

use crate::helpers::{TRACEPARENT, env};

#[tokio::test]
async fn every_kind_reaches_the_right_api_with_its_key_body_and_trace() {
    let env = env().await;
    let ship = env.enqueue("ship_order", 1, "evt_a").await;
    let conf = env.enqueue("send_confirmation", 1, "evt_a").await;
    let refund = env.enqueue("send_refund_notice", 2, "evt_b").await;
    let relay = env.relay(&[]);

    assert_eq!(relay.relay_once().await.unwrap(), Pass::Relayed(3));
    assert_eq!(relay.relay_once().await.unwrap(), Pass::Empty);
    for id in [ship, conf, refund] {
        let (status, attempts, error) = env.row_status(id).await;
        assert_eq!((status.as_str(), attempts, error), ("done", 1, None));
    }

    let stats = env.stats().await;
    assert_eq!(stats.by_path["/shipments"].requests, 1);
    assert_eq!(stats.by_path["/shipments"].effects, 1);
    assert_eq!(stats.by_path["/emails"].requests, 2);
    assert_eq!(stats.by_path["/emails"].effects, 2);
    assert_eq!(stats.double_effects, 0);
    let expect = [
        ("ship-1", r#"{"order_id":1,"event_id":"evt_a"}"#),
        (
            "conf-1",
            r#"{"order_id":1,"template":"order_confirmation","event_id":"evt_a"}"#,
        ),
        (
            "refund-2",
            r#"{"order_id":2,"template":"refund_notice","event_id":"evt_b"}"#,
        ),
    ];
    let trace_id = TRACEPARENT.split('-').nth(1).unwrap();
    for (key, body) in expect {
        let k = stats.key(key);
        assert_eq!((k.requests, k.effects), (1, 1), "{key}");
        assert_eq!(k.bodies, [body], "{key}");
        let tp = &k.traceparents[0];
        assert_eq!(
            tp.split('-').nth(1),
            Some(trace_id),
            "{key} joins the event's trace: {tp}"
        );
        assert_ne!(tp, TRACEPARENT, "{key}: the call has a span of its own");
    }
}

#[tokio::test]
async fn cancelled_rows_are_never_sent() {
    let env = env().await;
    let id = env.enqueue("ship_order", 1, "evt_a").await;
    env.client
        .execute(
            "UPDATE outbox SET status = 'cancelled', finished_at = now() WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    let relay = env.relay(&[]);
    assert_eq!(relay.relay_once().await.unwrap(), Pass::Empty);
    assert_eq!(env.stats().await.requests, 0);
}

/// Two relay processes on one outbox: every row done, and, with nothing
/// failing, no key requested twice: SKIP LOCKED hands each row to one relay.
#[tokio::test]
async fn two_relays_drain_5000_rows_without_sending_any_twice() {
    let env = env().await;
    env.seed(1, 5000).await;
    let settings = [("RELAY_POLL_INTERVAL_MS", "100"), ("RELAY_BATCH_SIZE", "50")];
    let a = env.spawn_relay(&settings);
    let b = env.spawn_relay(&settings);
    env.wait_for(
        "SELECT count(*) FROM outbox WHERE status = 'done'",
        5000,
        Duration::from_secs(120),
    )
    .await;
    let stats = env.stats().await;
    assert_eq!(stats.effects, 5000);
    assert_eq!(stats.requests, 5000, "no key was requested twice");
    let keys = stats.keys.as_ref().unwrap();
    assert_eq!(keys.len(), 5000);
    assert!(keys.values().all(|k| k.requests == 1 && k.effects == 1));
    let owners = env
        .count("SELECT count(*) FROM outbox WHERE lease_owner IS NOT NULL OR attempts <> 1")
        .await;
    assert_eq!(owners, 0);
    for relay in [a, b] {
        relay.signal("TERM");
        let (code, stderr) = relay.wait(Duration::from_secs(15));
        assert_eq!(code, Some(0), "{stderr}");
    }
}
