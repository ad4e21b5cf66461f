//! An idle relay is woken by the ingest's commit, not by its poll.

use std::time::{Duration, Instant};

use crate::harness::{Stack, StackOptions, event};

#[tokio::test]
async fn a_webhook_reaches_the_downstream_within_a_second_with_polling_a_minute_away() {
    let stack = Stack::start(StackOptions {
        relay_env: vec![("RELAY_POLL_INTERVAL_MS", "60000".into())],
        ..Default::default()
    })
    .await;
    for order in 1..=5 {
        stack.insert_order(order, &format!("pay_{order}")).await;
    }
    // Let the relay claim once, find nothing and wait on LISTEN.
    tokio::time::sleep(Duration::from_millis(800)).await;
    for order in 1..=5 {
        let body = event(
            &format!("evt_wake_{order}"),
            "payment.succeeded",
            &format!("pay_{order}"),
        );
        assert_eq!(stack.post(&body, &[]).await.status(), 200);
        let accepted = Instant::now();
        let key = format!("ship-{order}");
        loop {
            let stats = stack.downstream.stats();
            if stats
                .keys
                .as_ref()
                .and_then(|k| k.get(&key))
                .is_some_and(|k| k.effects == 1)
            {
                break;
            }
            assert!(
                accepted.elapsed() < Duration::from_secs(1),
                "{key} not delivered within a second"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
