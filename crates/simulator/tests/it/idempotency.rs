//! Keys as a Stripe-like API honours them: one effect per key, replays byte
//! for byte, 422 for another body, 409 while in progress.

use std::collections::HashSet;

use futures_util::future::join_all;
use simulator::downstream::{DownstreamConfig, Faults, TargetEffects};

use crate::helpers::{email, shipment, spawn, spawn_faulty, spawn_with};

#[tokio::test]
async fn same_key_and_body_make_one_effect_and_replay_byte_for_byte() {
    let sim = spawn().await;
    let first = sim.post("/shipments", "ship-1", &shipment(1)).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    assert_eq!(&first.body[..], br#"{"shipment_id":"SHP-000001","order_id":1}"#);

    let again = sim.post("/shipments", "ship-1", &shipment(1)).await;
    assert_eq!(again.status, 201);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);

    let stats = sim.running.stats();
    assert_eq!(
        (stats.requests, stats.effects, stats.replays, stats.double_effects),
        (2, 1, 1, 0)
    );
    let key = stats.key("ship-1");
    assert_eq!((key.requests, key.effects), (2, 1));
    assert_eq!(key.statuses, [201, 201]);
    assert_eq!(key.bodies, [shipment(1), shipment(1)]);
    assert!(key.effect_at_ms.is_some_and(|at| at >= key.first_at_ms));
}

#[tokio::test]
async fn emails_are_accepted_once_per_key() {
    let sim = spawn().await;
    let sent = sim
        .post("/emails", "conf-5", &email(5, "order_confirmation"))
        .await;
    assert_eq!(sent.status, 202);
    assert_eq!(
        &sent.body[..],
        br#"{"email_id":"EML-000001","order_id":5,"template":"order_confirmation"}"#
    );
    let again = sim
        .post("/emails", "conf-5", &email(5, "order_confirmation"))
        .await;
    assert_eq!((again.status, again.replayed()), (202, true));
    assert_eq!(again.body, sent.body);
    let refund = sim.post("/emails", "refund-5", &email(5, "refund_notice")).await;
    assert_eq!(refund.json()["email_id"], "EML-000002");

    let stats = sim.running.stats();
    assert_eq!(stats.by_path["/emails"].effects, 2);
    assert_eq!(stats.by_path["/shipments"].requests, 0);
    assert_eq!(stats.double_effects, 0, "two templates are two targets");
}

#[tokio::test]
async fn the_same_key_with_another_body_is_refused() {
    let sim = spawn().await;
    assert_eq!(sim.post("/shipments", "ship-2", &shipment(2)).await.status, 201);
    let other = sim.post("/shipments", "ship-2", &shipment(3)).await;
    assert_eq!(other.status, 422);
    assert_eq!(
        other.json(),
        serde_json::json!({"error": "idempotency key reused with a different body"})
    );
    assert_eq!(sim.running.stats().effects, 1);
}

#[tokio::test]
async fn twenty_concurrent_requests_with_one_key_make_one_effect() {
    let sim = spawn_faulty(Faults {
        latency_ms: "100".parse().unwrap(),
        ..Faults::default()
    })
    .await;
    let body = shipment(9);
    let answers = join_all((0..20).map(|_| sim.post("/shipments", "ship-9", &body))).await;

    let created: Vec<_> = answers
        .iter()
        .filter(|a| a.status == 201 && !a.replayed())
        .collect();
    assert_eq!(created.len(), 1, "{answers:?}");
    for answer in &answers {
        // The others arrived while it was in progress (409), or after (replay).
        assert!(
            answer.status == 409 || answer.body == created[0].body,
            "{answer:?}"
        );
    }
    let late = sim.post("/shipments", "ship-9", &body).await;
    assert!(late.replayed());
    assert_eq!(late.body, created[0].body);
    let stats = sim.running.stats();
    assert_eq!((stats.effects, stats.double_effects), (1, 0));
    assert_eq!(stats.key("ship-9").requests, 21);
}

#[tokio::test]
async fn without_idempotency_every_request_is_an_effect() {
    let sim = spawn_with(DownstreamConfig {
        idempotency: false,
        ..DownstreamConfig::default()
    })
    .await;
    let first = sim.post("/shipments", "ship-7", &shipment(7)).await;
    let second = sim.post("/shipments", "ship-7", &shipment(7)).await;
    assert_eq!((first.status, second.status), (201, 201));
    assert!(!second.replayed());
    assert_ne!(first.body, second.body, "two shipments");

    let stats = sim.running.stats();
    assert_eq!((stats.effects, stats.double_effects), (2, 1));
    assert_eq!(stats.key("ship-7").effects, 2);
    assert_eq!(
        stats.double_effect_targets,
        [TargetEffects {
            path: "/shipments".into(),
            order_id: 7,
            template: None,
            effects: 2,
        }]
    );
}

#[tokio::test]
async fn two_keys_for_one_order_are_a_double_effect_even_with_keys_honoured() {
    let sim = spawn().await;
    sim.post("/emails", "conf-3", &email(3, "order_confirmation"))
        .await;
    sim.post("/emails", "conf-3-again", &email(3, "order_confirmation"))
        .await;
    let stats = sim.running.stats();
    assert_eq!(stats.double_effects, 1);
    assert_eq!(
        stats.double_effect_targets[0].template.as_deref(),
        Some("order_confirmation")
    );
}

#[tokio::test]
async fn malformed_requests_are_400_without_effect() {
    let sim = spawn().await;
    let no_key = sim.try_post("/shipments", None, &shipment(1)).await.unwrap();
    assert_eq!(no_key.status, 400);
    assert!(
        no_key.json()["error"]
            .as_str()
            .unwrap()
            .contains("Idempotency-Key")
    );
    for (path, body) in [
        ("/shipments", "not json"),
        ("/shipments", r#"{"event_id":"evt_1"}"#),
        ("/shipments", r#"{"order_id":"1"}"#),
        ("/emails", r#"{"order_id":1}"#),
        ("/emails", r#"{"order_id":1,"template":"newsletter"}"#),
    ] {
        let answer = sim.post(path, "bad", body).await;
        assert_eq!(answer.status, 400, "{path} {body}");
        assert!(answer.json()["error"].is_string());
    }
    let stats = sim.running.stats();
    assert_eq!((stats.requests, stats.effects), (6, 0));
    assert_eq!(stats.status_count("400"), 6);
    assert_eq!(stats.key("bad").statuses, [400; 5]);

    // Extra fields are fine, and a refused request left the key free.
    let fine = sim
        .post("/shipments", "bad", r#"{"order_id":1,"event_id":"e","v":2}"#)
        .await;
    assert_eq!(fine.status, 201);
}

#[tokio::test]
async fn ids_are_sequential_and_distinct_across_keys() {
    let sim = spawn().await;
    let answers = join_all((1..=30).map(|n| {
        let body = shipment(n);
        let key = format!("ship-{n}");
        let sim = &sim;
        async move { sim.post("/shipments", &key, &body).await }
    }))
    .await;
    let ids: HashSet<String> = answers
        .iter()
        .map(|a| a.json()["shipment_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 30);
    assert!(ids.contains("SHP-000001") && ids.contains("SHP-000030"));
}
