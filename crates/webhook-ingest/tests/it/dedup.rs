//! The core promise: one event id, one effect, whatever the deliveries.

use crate::helpers::{event, spawn_app};

#[tokio::test]
async fn a_duplicate_delivery_has_no_second_effect_and_replays_the_same_bytes() {
    let app = spawn_app().await;
    app.insert_order(1, "pay_1", "pending").await;
    let body = event("evt_dup_1", "payment.succeeded", "pay_1");

    let first = app.post(&body).await;
    assert_eq!(first.status(), 200);
    assert!(first.headers().get("idempotent-replayed").is_none());
    assert_eq!(first.headers()["content-type"], "application/json");
    let first_body = first.bytes().await.unwrap();

    let second = app.post(&body).await;
    assert_eq!(second.status(), 200);
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    let second_body = second.bytes().await.unwrap();
    assert_eq!(first_body, second_body, "the replay must be byte-identical");

    let result: serde_json::Value = serde_json::from_slice(&first_body).unwrap();
    assert_eq!(result["event_id"], "evt_dup_1");
    assert_eq!(result["status"], "processed");
    assert_eq!(result["order_id"], 1);

    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE kind = 'ship_order'")
            .await,
        1
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE kind = 'send_confirmation'")
            .await,
        1
    );
    assert_eq!(app.count("SELECT count(*) FROM outbox").await, 2);
    assert_eq!(app.order_status(1).await, "paid");
    assert_eq!(
        app.count("SELECT deliveries::int8 FROM processed_events WHERE event_id = 'evt_dup_1'")
            .await,
        2,
        "the duplicate delivery is counted"
    );
    let keys: Vec<String> = app
        .client
        .query("SELECT idempotency_key FROM outbox ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(keys, ["ship-1", "conf-1"]);
}

#[tokio::test]
async fn a_replay_much_later_still_replays() {
    let app = spawn_app().await;
    app.insert_order(2, "pay_2", "pending").await;
    let body = event("evt_late", "payment.succeeded", "pay_2");
    let first = app.post(&body).await.text().await.unwrap();
    // Ship it, as the relay would, then redeliver.
    app.client
        .execute("UPDATE outbox SET status = 'done', finished_at = now()", &[])
        .await
        .unwrap();
    for _ in 0..3 {
        let again = app.post(&body).await;
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.text().await.unwrap(), first);
    }
    assert_eq!(app.count("SELECT count(*) FROM outbox").await, 2);
    assert_eq!(
        app.count("SELECT deliveries::int8 FROM processed_events").await,
        4
    );
}

/// Twenty concurrent deliveries of each of many events: one processes, the
/// others replay its result, and each order gets exactly one shipment and one
/// confirmation. Repeated over many events so a race would show.
#[tokio::test]
async fn concurrent_deliveries_of_one_event_produce_exactly_one_effect() {
    const EVENTS: i64 = 30;
    const COPIES: usize = 20;
    let app = spawn_app().await;
    for i in 0..EVENTS {
        app.insert_order(100 + i, &format!("pay_c{i}"), "pending").await;
    }
    for i in 0..EVENTS {
        let body = event(
            &format!("evt_conc_{i}"),
            "payment.succeeded",
            &format!("pay_c{i}"),
        );
        let responses = futures_util::future::join_all((0..COPIES).map(|_| app.post(&body))).await;
        let mut bodies = Vec::new();
        let mut fresh = 0;
        for r in responses {
            assert_eq!(r.status(), 200);
            if r.headers().get("idempotent-replayed").is_none() {
                fresh += 1;
            }
            bodies.push(r.bytes().await.unwrap());
        }
        assert_eq!(fresh, 1, "exactly one delivery of evt_conc_{i} processed it");
        assert!(
            bodies.windows(2).all(|w| w[0] == w[1]),
            "every delivery got the same body"
        );
    }
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE kind = 'ship_order'")
            .await,
        EVENTS
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE kind = 'send_confirmation'")
            .await,
        EVENTS
    );
    assert_eq!(
        app.count("SELECT count(DISTINCT idempotency_key) FROM outbox")
            .await,
        2 * EVENTS
    );
    assert_eq!(
        app.count("SELECT sum(deliveries)::int8 FROM processed_events")
            .await,
        EVENTS * COPIES as i64
    );
}

/// Distinct events for one order arriving together: one pays it, the others
/// find it paid. Only one shipment.
#[tokio::test]
async fn concurrent_distinct_events_for_one_order_ship_once() {
    let app = spawn_app().await;
    app.insert_order(7, "pay_7", "pending").await;
    let bodies: Vec<String> = (0..10)
        .map(|i| event(&format!("evt_same_order_{i}"), "payment.succeeded", "pay_7"))
        .collect();
    let responses = futures_util::future::join_all(bodies.iter().map(|b| app.post(b))).await;
    let mut statuses = Vec::new();
    for r in responses {
        assert_eq!(r.status(), 200);
        let v: serde_json::Value = r.json().await.unwrap();
        statuses.push(v["status"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        statuses.iter().filter(|s| *s == "processed").count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| *s == "already_paid").count(),
        9,
        "{statuses:?}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE kind = 'ship_order'")
            .await,
        1
    );
}

/// A failure after the claim (here: the order update raises) must take the
/// claim with it. Were the claim committed on its own, the retry would find
/// the id taken and replay a result whose effects never happened.
#[tokio::test]
async fn a_failure_after_the_claim_rolls_the_claim_back() {
    let app = spawn_app().await;
    app.insert_order(9, "pay_9", "pending").await;
    app.client
        .batch_execute(
            "CREATE FUNCTION test_fail_order_update() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'injected failure after the claim'; END $$;
             CREATE TRIGGER test_fail BEFORE UPDATE ON orders
               FOR EACH ROW EXECUTE FUNCTION test_fail_order_update();",
        )
        .await
        .unwrap();
    let body = event("evt_crash", "payment.succeeded", "pay_9");
    let failed = app.post(&body).await;
    assert_eq!(failed.status(), 500);
    assert_eq!(
        app.written().await,
        (0, 0),
        "no claim, no outbox row survives the failure"
    );
    assert_eq!(app.order_status(9).await, "pending");

    app.client
        .batch_execute("DROP TRIGGER test_fail ON orders")
        .await
        .unwrap();
    let retried = app.post(&body).await;
    assert_eq!(retried.status(), 200);
    assert!(
        retried.headers().get("idempotent-replayed").is_none(),
        "the retry processes it"
    );
    let v: serde_json::Value = retried.json().await.unwrap();
    assert_eq!(v["status"], "processed");
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE kind = 'ship_order'")
            .await,
        1
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE kind = 'send_confirmation'")
            .await,
        1
    );
    assert_eq!(app.order_status(9).await, "paid");
}
