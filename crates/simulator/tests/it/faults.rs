//! Injected faults: drawn at a rate, or scripted per key. None of them
//! creates an effect except a hang, whose work is done and answer late.

use std::time::{Duration, Instant};

use simulator::downstream::{DownstreamConfig, Faults, ScriptStep};

use crate::helpers::{shipment, spawn, spawn_faulty, spawn_with};

#[tokio::test]
async fn a_scripted_500_500_200_fails_twice_then_succeeds_once() {
    let sim = spawn().await;
    let set = sim
        .control("/control/script", r#"{"key":"ship-1","responses":[500,500,200]}"#)
        .await;
    assert_eq!(set.status, 200);
    let statuses = [
        sim.post("/shipments", "ship-1", &shipment(1)).await.status,
        sim.post("/shipments", "ship-1", &shipment(1)).await.status,
        sim.post("/shipments", "ship-1", &shipment(1)).await.status,
    ];
    assert_eq!(statuses, [500, 500, 201]);
    let after = sim.post("/shipments", "ship-1", &shipment(1)).await;
    assert!(after.replayed(), "script exhausted: normal behaviour");

    let stats = sim.running.stats();
    assert_eq!(stats.effects, 1);
    assert_eq!(stats.key("ship-1").statuses, [500, 500, 201, 201]);
    assert_eq!((stats.injected.scripted, stats.injected.errors), (3, 2));
    assert_eq!(stats.status_count("500"), 2);
}

#[tokio::test]
async fn every_scripted_kind() {
    let sim = spawn().await;
    sim.running
        .set_faults(Faults {
            retry_after_secs: 4,
            hang_ms: 300,
            ..Faults::default()
        })
        .unwrap();
    sim.running.script(
        "ship-2",
        [
            ScriptStep::Status(400),
            ScriptStep::Status(404),
            ScriptStep::Status(409),
            ScriptStep::Status(422),
            ScriptStep::Status(429),
            ScriptStep::Status(503),
            ScriptStep::Reset,
            ScriptStep::Hang,
        ],
    );
    for expected in [400, 404, 409, 422, 429, 503] {
        let answer = sim.post("/shipments", "ship-2", &shipment(2)).await;
        assert_eq!(answer.status, expected);
        let retry_after = answer
            .headers
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(retry_after.as_deref(), (expected == 429).then_some("4"));
    }
    assert!(
        sim.try_post("/shipments", Some("ship-2"), &shipment(2))
            .await
            .is_err()
    );
    let started = Instant::now();
    let hung = sim.post("/shipments", "ship-2", &shipment(2)).await;
    assert_eq!((hung.status, hung.replayed()), (201, false));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        sim.running.stats().key("ship-2").statuses,
        [400, 404, 409, 422, 429, 503, 0, 201]
    );
}

#[tokio::test]
async fn rate_429_carries_retry_after_and_no_effect() {
    let sim = spawn_faulty(Faults {
        rate_429: 1.0,
        retry_after_secs: 7,
        ..Faults::default()
    })
    .await;
    let answer = sim.post("/shipments", "ship-3", &shipment(3)).await;
    assert_eq!(answer.status, 429);
    assert_eq!(answer.headers["retry-after"], "7");
    let stats = sim.running.stats();
    assert_eq!((stats.effects, stats.injected.rate_limited), (0, 1));
}

#[tokio::test]
async fn error_rate_answers_5xx_without_effect() {
    let sim = spawn_faulty(Faults {
        error_rate: 1.0,
        ..Faults::default()
    })
    .await;
    for _ in 0..10 {
        let answer = sim.post("/shipments", "ship-4", &shipment(4)).await;
        assert!([500, 502, 503].contains(&answer.status), "{answer:?}");
    }
    assert_eq!(sim.running.stats().effects, 0);
    sim.running.set_faults(Faults::default()).unwrap();
    let answer = sim.post("/shipments", "ship-4", &shipment(4)).await;
    assert_eq!(
        (answer.status, answer.replayed()),
        (201, false),
        "nothing was stored"
    );
}

#[tokio::test]
async fn a_reset_is_a_connection_error_for_a_real_client() {
    let sim = spawn_faulty(Faults {
        reset_rate: 1.0,
        ..Faults::default()
    })
    .await;
    let err = sim
        .try_post("/shipments", Some("ship-5"), &shipment(5))
        .await
        .expect_err("no HTTP answer");
    assert!(!err.is_status() && !err.is_timeout(), "{err:?}");

    // The same client (and its pool) works again once the fault is gone.
    sim.running.set_faults(Faults::default()).unwrap();
    let answer = sim.post("/shipments", "ship-5", &shipment(5)).await;
    assert_eq!((answer.status, answer.replayed()), (201, false));
    let stats = sim.running.stats();
    assert_eq!(stats.effects, 1);
    assert_eq!((stats.status_count("reset"), stats.injected.resets), (1, 1));
    assert_eq!(stats.key("ship-5").statuses, [0, 201]);
}

#[tokio::test]
async fn a_reset_sends_no_bytes_on_a_raw_socket() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let sim = spawn_faulty(Faults {
        reset_rate: 1.0,
        ..Faults::default()
    })
    .await;
    let mut socket = tokio::net::TcpStream::connect(sim.running.addr()).await.unwrap();
    let body = shipment(6);
    let request = format!(
        "POST /shipments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: ship-6\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut received = Vec::new();
    // EOF or ECONNRESET, but never an HTTP answer.
    let _ = socket.read_to_end(&mut received).await;
    assert!(received.is_empty(), "{:?}", String::from_utf8_lossy(&received));
}

#[tokio::test]
async fn a_hang_creates_the_effect_and_the_retry_replays_it() {
    for idempotency in [true, false] {
        let sim = spawn_with(DownstreamConfig {
            idempotency,
            faults: Faults {
                hang_rate: 1.0,
                hang_ms: 800,
                ..Faults::default()
            },
            ..DownstreamConfig::default()
        })
        .await;
        let timed_out = sim
            .http
            .post(format!("{}/shipments", sim.url))
            .header("idempotency-key", "ship-8")
            .body(shipment(8))
            .timeout(Duration::from_millis(100))
            .send()
            .await
            .expect_err("the client gives up first");
        assert!(timed_out.is_timeout());

        sim.running.set_faults(Faults::default()).unwrap();
        let retry = sim.post("/shipments", "ship-8", &shipment(8)).await;
        assert_eq!(retry.status, 201);
        let stats = sim.running.stats();
        assert_eq!(stats.injected.hangs, 1);
        if idempotency {
            assert!(retry.replayed(), "the hung request did the work");
            assert_eq!((stats.effects, stats.double_effects), (1, 0));
        } else {
            assert_eq!((stats.effects, stats.double_effects), (2, 1));
        }
    }
}

#[tokio::test]
async fn latency_is_waited_before_answering() {
    let sim = spawn_faulty(Faults {
        latency_ms: "150..200".parse().unwrap(),
        ..Faults::default()
    })
    .await;
    let started = Instant::now();
    assert_eq!(sim.post("/shipments", "ship-9", &shipment(9)).await.status, 201);
    assert!(started.elapsed() >= Duration::from_millis(150));
}
