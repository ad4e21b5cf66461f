//! Every call with a key is recorded as the downstream saw it: when it
//! arrived and ended, what it answered, whether it made the effect, whether
//! a hang held its answer back.
//!
//! A hung call whose client gives up is NOT cut short: actix keeps running a
//! handler whose client closed the connection (it allows half-closed
//! connections), so the record shows the effect at once, then, when the
//! hang is over, the late status (201) that was handed to the server and
//! never reached anyone. Status 0 with an effect is what a handler dropped
//! mid-hang records (a server stopping with the call in flight); the drop
//! itself is tested beside the guard, in `downstream/state.rs`.

use std::time::Duration;

use simulator::downstream::{CallRecord, Faults, ScriptStep, Stats};

use crate::helpers::{TestDownstream, shipment, spawn};

/// Waits until the key's `n`-th call has ended; a hung call ends only when
/// the server notices its client went away.
async fn ended(sim: &TestDownstream, key: &str, n: usize) -> Stats {
    for _ in 0..500 {
        let stats = sim.running.stats();
        let calls = stats
            .keys
            .as_ref()
            .and_then(|keys| keys.get(key))
            .map(|k| &k.calls);
        if calls.is_some_and(|calls| calls.len() >= n && calls[..n].iter().all(|c| c.ended_us != 0)) {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{key}: {n} calls never ended: {:?}", sim.running.stats().keys);
}

fn shape(call: &CallRecord) -> (u16, bool, bool) {
    (call.status, call.effect, call.hung)
}

#[tokio::test]
async fn a_normal_call_an_injected_503_and_a_reset_are_recorded_in_order() {
    let sim = spawn().await;
    sim.running
        .script("ship-1", [ScriptStep::Status(503), ScriptStep::Reset]);
    assert_eq!(sim.post("/shipments", "ship-1", &shipment(1)).await.status, 503);
    assert!(
        sim.try_post("/shipments", Some("ship-1"), &shipment(1))
            .await
            .is_err()
    );
    assert_eq!(sim.post("/shipments", "ship-1", &shipment(1)).await.status, 201);
    let replay = sim.post("/shipments", "ship-1", &shipment(1)).await;
    assert!(replay.replayed());

    let stats = ended(&sim, "ship-1", 4).await;
    let calls = &stats.key("ship-1").calls;
    let shapes: Vec<_> = calls.iter().map(shape).collect();
    assert_eq!(
        shapes,
        [
            (503, false, false),
            (0, false, false),
            (201, true, false),
            (201, false, false),
        ]
    );
    for call in calls {
        assert!(
            call.arrived_us > 0 && call.ended_us >= call.arrived_us,
            "{call:?}"
        );
    }
    for pair in calls.windows(2) {
        assert!(
            pair[0].ended_us <= pair[1].arrived_us,
            "one after another: {pair:?}"
        );
    }
    assert_eq!(stats.key("ship-1").statuses, [503, 0, 201, 201]);
}

#[tokio::test]
async fn a_hung_call_whose_client_gives_up_made_the_effect_and_answers_late() {
    let sim = spawn().await;
    // Far longer than the client waits, so the call is still hung when the
    // client has given up.
    sim.running
        .set_faults(Faults {
            hang_ms: 2_000,
            ..Faults::default()
        })
        .unwrap();
    sim.running.script("ship-2", [ScriptStep::Hang]);
    let timed_out = sim
        .http
        .post(format!("{}/shipments", sim.url))
        .header("idempotency-key", "ship-2")
        .body(shipment(2))
        .timeout(Duration::from_millis(100))
        .send()
        .await
        .expect_err("the client gives up first");
    assert!(timed_out.is_timeout());
    let in_flight = sim.running.stats().key("ship-2").calls.clone();
    assert_eq!(
        in_flight
            .iter()
            .map(|c| (c.ended_us, shape(c)))
            .collect::<Vec<_>>(),
        [(0, (0, true, true))],
        "the work is done, the answer not yet given"
    );

    let stats = ended(&sim, "ship-2", 1).await;
    let key = stats.key("ship-2");
    assert_eq!(
        key.calls.iter().map(shape).collect::<Vec<_>>(),
        [(201, true, true)]
    );
    assert_eq!(key.calls[0].arrived_us, in_flight[0].arrived_us);
    assert_eq!((key.effects, stats.injected.hangs), (1, 1));
    // The retry finds the work done.
    let retry = sim.post("/shipments", "ship-2", &shipment(2)).await;
    assert!(retry.replayed());
    let stats = ended(&sim, "ship-2", 2).await;
    assert_eq!(shape(&stats.key("ship-2").calls[1]), (201, false, false));
}

#[tokio::test]
async fn a_rejected_body_is_a_call_and_calls_serialize_in_stats() {
    let sim = spawn().await;
    assert_eq!(sim.post("/shipments", "ship-3", "{}").await.status, 400);
    assert_eq!(sim.post("/shipments", "ship-3", &shipment(3)).await.status, 201);
    let over_http: Stats = serde_json::from_value(sim.get_json("/stats").await).unwrap();
    let calls = &over_http.key("ship-3").calls;
    assert_eq!(
        calls.iter().map(shape).collect::<Vec<_>>(),
        [(400, false, false), (201, true, false)]
    );
    assert_eq!(over_http.keys, sim.running.stats().keys);
}
