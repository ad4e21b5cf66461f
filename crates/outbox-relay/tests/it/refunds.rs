//! What the relay does with a shipment its order's refund cancelled.

use std::time::{Duration, Instant};

use crate::helpers::env;

/// Claimed while a slow call holds the relay's only call slot, a shipment
/// waits for it; its order is refunded meanwhile (the ingest cancels the row
/// and leaves the lease). It was not yet under way: it is never sent, and
/// its lease ends with its attempt undone.
///
/// The shipment falls due 300 ms after the confirmation, so it is claimed
/// after the confirmation's call took the slot. (Claimed in one batch, the
/// two rows' tasks race for the slot, and a shipment served first, its
/// `done` not yet recorded, looked to this test like one still waiting.)
#[tokio::test]
async fn a_shipment_cancelled_while_it_waits_for_a_call_slot_is_not_sent() {
    let env = env().await;
    env.set_latency("1000").await;
    env.enqueue("send_confirmation", 1, "evt_1").await;
    let waiting = env.enqueue("ship_order", 2, "evt_2").await;
    env.client
        .execute(
            "UPDATE outbox SET available_at = now() + interval '300 milliseconds' WHERE id = $1",
            &[&waiting],
        )
        .await
        .unwrap();
    let _relay = env.spawn_relay(&[
        ("RELAY_CONCURRENCY", "1"),
        ("RELAY_BATCH_SIZE", "10"),
        ("RELAY_LEASE_SECS", "20"),
        ("RELAY_HTTP_TIMEOUT_MS", "5000"),
        ("RELAY_POLL_INTERVAL_MS", "50"),
    ]);
    // Both claimed; the confirmation's call is being served.
    let started = Instant::now();
    loop {
        let leased = env
            .count("SELECT count(*) FROM outbox WHERE lease_owner IS NOT NULL")
            .await;
        let calling = env
            .stats()
            .await
            .keys
            .as_ref()
            .and_then(|k| k.get("conf-1"))
            .is_some_and(|k| k.requests == 1);
        if leased == 2 && calling {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never claimed both");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The refund, as the ingest writes it.
    env.client
        .execute(
            "UPDATE outbox SET status = 'cancelled', finished_at = now(), last_error = 'cancelled by evt_refund_2'
              WHERE id = $1",
            &[&waiting],
        )
        .await
        .unwrap();
    env.wait_for(
        "SELECT count(*) FROM outbox WHERE lease_owner IS NULL AND status <> 'pending'",
        2,
        Duration::from_secs(15),
    )
    .await;
    let stats = env.stats().await;
    assert!(
        stats.keys.as_ref().unwrap().get("ship-2").is_none(),
        "the cancelled shipment was sent"
    );
    let (status, attempts, error) = env.row_status(waiting).await;
    assert_eq!((status.as_str(), attempts), ("cancelled", 0));
    assert_eq!(error.as_deref(), Some("cancelled by evt_refund_2"));
}
