//! `/stats` and `/control/*`.

use simulator::downstream::{Faults, Stats};

use crate::helpers::{email, shipment, spawn};

#[tokio::test]
async fn stats_has_the_documented_shape() {
    let sim = spawn().await;
    sim.post("/shipments", "ship-1", &shipment(1)).await;
    sim.post("/shipments", "ship-1", &shipment(1)).await;
    sim.post("/emails", "conf-1", &email(1, "order_confirmation"))
        .await;

    let json = sim.get_json("/stats").await;
    for field in [
        "requests",
        "effects",
        "double_effects",
        "by_path",
        "status_counts",
        "keys",
    ] {
        assert!(json.get(field).is_some(), "{field} missing from {json}");
    }
    assert_eq!(json["requests"], 3);
    assert_eq!(json["effects"], 2);
    assert_eq!(
        json["by_path"]["/shipments"],
        serde_json::json!({"requests": 2, "effects": 1})
    );
    assert_eq!(
        json["by_path"]["/emails"],
        serde_json::json!({"requests": 1, "effects": 1})
    );
    assert_eq!(json["status_counts"], serde_json::json!({"201": 2, "202": 1}));
    let key = &json["keys"]["ship-1"];
    assert_eq!(key["requests"], 2);
    assert_eq!(key["effects"], 1);
    assert_eq!(key["statuses"], serde_json::json!([201, 201]));
    assert_eq!(
        key["traceparents"][0],
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    );
    assert_eq!(key["bodies"][0], shipment(1));
    for field in ["first_at_ms", "last_at_ms", "effect_at_ms"] {
        assert!(
            key[field].as_u64().is_some_and(|ms| ms > 1_600_000_000_000),
            "{field}"
        );
    }

    let parsed: Stats = serde_json::from_value(json).unwrap();
    assert_eq!(parsed, sim.running.stats());

    let totals = sim.get_json("/stats?keys=false").await;
    assert!(totals.get("keys").is_none());
    assert_eq!(
        serde_json::from_value::<Stats>(totals).unwrap(),
        sim.running.totals()
    );
}

#[tokio::test]
async fn samples_per_key_are_bounded() {
    let sim = spawn().await;
    for _ in 0..12 {
        sim.post("/shipments", "ship-2", &shipment(2)).await;
    }
    let stats = sim.running.stats();
    let key = stats.key("ship-2");
    assert_eq!(key.requests, 12);
    assert_eq!(
        (key.traceparents.len(), key.bodies.len(), key.statuses.len()),
        (10, 10, 12)
    );
}

#[tokio::test]
async fn control_faults_change_behaviour_at_runtime() {
    let sim = spawn().await;
    let set = sim
        .control("/control/faults", r#"{"rate_429": 1.0, "retry_after_secs": 3}"#)
        .await;
    assert_eq!(set.status, 200);
    let answer = sim.post("/shipments", "ship-3", &shipment(3)).await;
    assert_eq!(
        (answer.status, &answer.headers["retry-after"]),
        (429, &"3".parse().unwrap())
    );

    let current: Faults = serde_json::from_value(sim.get_json("/control/faults").await).unwrap();
    assert_eq!(current.rate_429, 1.0);
    assert_eq!(current, sim.running.faults());

    // Omitted fields go back to their defaults.
    assert_eq!(
        sim.control("/control/faults", r#"{"latency_ms": "0..1"}"#)
            .await
            .status,
        200
    );
    assert_eq!(sim.post("/shipments", "ship-3", &shipment(3)).await.status, 201);
    assert_eq!(sim.running.faults().rate_429, 0.0);

    for bad in [
        r#"{"error_rate": 2}"#,
        r#"{"eror_rate": 0.1}"#,
        r#"{"latency_ms": "soon"}"#,
        "nope",
    ] {
        let refused = sim.control("/control/faults", bad).await;
        assert_eq!(refused.status, 400, "{bad}");
        assert!(refused.json()["error"].is_string());
    }
    assert_eq!(sim.running.faults().latency_ms, "0..1".parse().unwrap());
}

#[tokio::test]
async fn control_reset_forgets_keys_scripts_and_stats_but_not_faults() {
    let sim = spawn().await;
    let first = sim.post("/shipments", "ship-4", &shipment(4)).await;
    sim.control("/control/script", r#"{"key":"ship-5","responses":[503]}"#)
        .await;
    sim.running
        .set_faults(Faults {
            retry_after_secs: 9,
            ..Faults::default()
        })
        .unwrap();

    assert_eq!(sim.control("/control/reset", "").await.status, 200);
    assert_eq!(
        sim.running.stats(),
        Stats {
            by_path: sim.running.stats().by_path,
            keys: Some(Default::default()),
            ..Stats::default()
        }
    );
    assert_eq!(sim.running.stats().by_path["/shipments"].requests, 0);
    assert_eq!(sim.running.faults().retry_after_secs, 9);

    let again = sim.post("/shipments", "ship-4", &shipment(4)).await;
    assert!(!again.replayed(), "the key was forgotten");
    assert_ne!(again.body, first.body, "ids are never handed out twice");
    assert_eq!(sim.post("/shipments", "ship-5", &shipment(5)).await.status, 201);
}

#[tokio::test]
async fn bad_scripts_are_refused() {
    let sim = spawn().await;
    for bad in [
        r#"{"key":"k","responses":[99]}"#,
        r#"{"key":"k","responses":["later"]}"#,
        r#"{"responses":[500]}"#,
    ] {
        assert_eq!(sim.control("/control/script", bad).await.status, 400, "{bad}");
    }
    let unknown = sim.control("/nowhere", "").await;
    assert_eq!(unknown.status, 404);
}
