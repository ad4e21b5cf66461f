//! Metrics equal to the workload; logs that carry the event's ids and never
//! a secret.

use super::*;

/// After a known workload, every counter on both services equals what the test caused.
#[tokio::test]
async fn metrics_equal_the_workload() {
    let stack = Stack::start(StackOptions::default()).await;
    for i in 1..=3 {
        stack.insert_order(i, &format!("pay_{i}")).await;
    }
    stack
        .downstream
        .script("conf-2", [simulator::downstream::ScriptStep::Status(503)]);
    stack
        .downstream
        .script("conf-3", [simulator::downstream::ScriptStep::Status(400)]);
    let statuses = [
        stack
            .post(&event("evt_m1", "payment.succeeded", "pay_1"), &[])
            .await
            .status(),
        stack
            .post(&event("evt_m2", "payment.succeeded", "pay_2"), &[])
            .await
            .status(),
        stack
            .post(&event("evt_m3", "payment.succeeded", "pay_3"), &[])
            .await
            .status(),
        stack
            .post(&event("evt_m1", "payment.succeeded", "pay_1"), &[])
            .await
            .status(),
        stack
            .post(&event("evt_m4", "payment.succeeded", "pay_1"), &[])
            .await
            .status(),
        stack
            .post(&event("evt_m5", "payment.succeeded", "pay_nobody"), &[])
            .await
            .status(),
        stack
            .post(&event("evt_m6", "customer.created", "pay_1"), &[])
            .await
            .status(),
        stack.post(r#"{"no":"id"}"#, &[]).await.status(),
        stack
            .post_signed_with(
                &event("evt_m7", "payment.succeeded", "pay_1"),
                "whsec_QUJDREVGR0hJSktMTU5PUA==",
                &[],
            )
            .await
            .status(),
        stack
            .post(
                &format!(r#"{{"id":"evt_big","pad":"{}"}}"#, "x".repeat(300_000)),
                &[],
            )
            .await
            .status(),
    ];
    assert_eq!(
        statuses.map(|s| s.as_u16()),
        [200, 200, 200, 200, 200, 200, 200, 400, 401, 413]
    );

    let m = stack.metrics(&stack.ingest_admin).await;
    for (outcome, n) in [
        ("processed", 3.0),
        ("duplicate", 1.0),
        ("already_paid", 1.0),
        ("unmatched", 1.0),
        ("ignored", 1.0),
        ("malformed", 1.0),
        ("invalid_signature", 1.0),
        ("too_large", 1.0),
        ("unavailable", 0.0),
    ] {
        assert_eq!(
            m.get("webhook_requests_total", &[("outcome", outcome)]),
            n,
            "{outcome}"
        );
    }
    assert_eq!(m.get("webhook_request_duration_seconds_count", &[]), 10.0);
    assert!(m.has("webhook_request_duration_seconds_bucket"));

    // 6 rows: 5 done (conf-2 after one retry), conf-3 dead at once.
    stack
        .wait_for(
            "SELECT count(*) FROM outbox WHERE status IN ('done', 'dead')",
            6,
            Duration::from_secs(60),
        )
        .await;
    let started = std::time::Instant::now();
    loop {
        let m = stack.metrics(&stack.relay_admin).await;
        let gauges_fresh = m.get("outbox_dead", &[]) == 1.0 && m.get("outbox_pending", &[]) == 0.0;
        if gauges_fresh {
            assert_eq!(
                m.get(
                    "outbox_dispatch_total",
                    &[("kind", "ship_order"), ("outcome", "done")]
                ),
                3.0
            );
            assert_eq!(
                m.get(
                    "outbox_dispatch_total",
                    &[("kind", "send_confirmation"), ("outcome", "done")]
                ),
                2.0
            );
            assert_eq!(
                m.get(
                    "outbox_dispatch_total",
                    &[("kind", "send_confirmation"), ("outcome", "retry")]
                ),
                1.0
            );
            assert_eq!(
                m.get(
                    "outbox_dispatch_total",
                    &[("kind", "send_confirmation"), ("outcome", "dead")]
                ),
                1.0
            );
            assert_eq!(
                m.get(
                    "outbox_dispatch_duration_seconds_count",
                    &[("kind", "ship_order")]
                ),
                3.0
            );
            assert_eq!(
                m.get(
                    "outbox_dispatch_duration_seconds_count",
                    &[("kind", "send_confirmation")]
                ),
                4.0
            );
            assert_eq!(m.get("outbox_enqueue_to_done_seconds_count", &[]), 5.0);
            assert_eq!(m.get("outbox_oldest_pending_age_seconds", &[]), 0.0);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "gauges never refreshed: {m:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Lines written while handling an event carry its trace and event ids; no
/// secret, signature or raw body is ever logged.
#[tokio::test]
async fn logs_carry_the_event_and_trace_ids_and_no_secret() {
    let mut stack = Stack::start(StackOptions::default()).await;
    stack.insert_order(5, "pay_5").await;
    stack
        .downstream
        .script("ship-5", [simulator::downstream::ScriptStep::Status(500)]);
    let body = event("evt_logged", "payment.succeeded", "pay_5");
    let traceparent = format!("00-{PROVIDER_TRACE}-{PROVIDER_SPAN}-01");
    assert_eq!(
        stack.post(&body, &[("traceparent", &traceparent)]).await.status(),
        200
    );
    let forged = stack
        .post_signed_with(&body, "whsec_QUJDREVGR0hJSktMTU5PUA==", &[])
        .await;
    assert_eq!(forged.status(), 401);
    stack
        .wait_for(
            "SELECT count(*) FROM outbox WHERE status = 'done'",
            2,
            Duration::from_secs(60),
        )
        .await;
    stack.ingest.stop(Duration::from_secs(10));
    stack.relay.stop(Duration::from_secs(60));

    let ingest_log = stack.ingest.log();
    let relay_log = stack.relay.log();
    for (name, log) in [("ingest", &ingest_log), ("relay", &relay_log)] {
        assert!(!log.is_empty(), "{name} logged nothing");
        for line in log.lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{name}: not one JSON object: {line:?}: {e}"));
            assert!(
                v.is_object() && v["message"].is_string() && v["level"].is_string(),
                "{line}"
            );
        }
        let secret_key = SECRET.trim_start_matches("whsec_");
        assert!(!log.contains(secret_key), "{name} logged the secret");
        assert!(!log.contains("v1,"), "{name} logged a signature");
        // The body's own fields, not its digits alone: "4200" turns up by
        // chance in a timestamp's nanoseconds or a trace id now and then.
        assert!(
            !log.contains("\"amount\"") && !log.contains("\"currency\""),
            "{name} logged a raw body"
        );
    }
    let accepted = ingest_log
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["message"] == "webhook accepted")
        .expect("a line for the accepted event");
    assert_eq!(accepted["event_id"], "evt_logged");
    assert_eq!(accepted["trace_id"], PROVIDER_TRACE);
    assert!(accepted["span_id"].as_str().is_some_and(|s| s.len() == 16));
    let retry = relay_log
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["message"] == "downstream call finished" && v["outcome"] == "retry")
        .expect("a line for the failed ship attempt");
    assert_eq!(retry["event_id"], "evt_logged");
    assert_eq!(retry["trace_id"], PROVIDER_TRACE);
    assert_eq!(retry["idempotency_key"], "ship-5");
    assert_eq!(retry["attempt"], 1);
    assert_eq!(retry["kind"], "ship_order");
    assert!(retry["outbox_id"].is_i64() && retry["duration_ms"].is_number());
    // Lines are written in batches (process::logs::FLUSH_EVERY), and a
    // service that stops writes those it still holds: the relay's last line,
    // logged as it returns, is there.
    let last = relay_log
        .lines()
        .last()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap());
    assert_eq!(
        last.as_ref().and_then(|v| v["message"].as_str()),
        Some("outbox-relay stopped: in-flight calls recorded, unstarted rows released"),
        "the relay's last line"
    );
    // The relay runs on one thread (process::runtime), the ingest on a
    // worker per CPU: each says so when its runtime starts.
    let runtime_threads = |log: &str| {
        log.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|v| v["message"] == "runtime started")
            .and_then(|v| v["threads"].as_u64())
    };
    assert_eq!(runtime_threads(&relay_log), Some(1), "the relay's runtime");
    assert!(
        runtime_threads(&ingest_log).is_some_and(|n| n >= 1),
        "the ingest's runtime"
    );
}
