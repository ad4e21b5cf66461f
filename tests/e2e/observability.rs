//! One trace per event across both services; metrics equal to the workload;
//! logs that carry the event's ids and never a secret.

use std::time::Duration;

use harness::{SECRET, Stack, StackOptions, event};

use crate::harness;

const PROVIDER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const PROVIDER_SPAN: &str = "b7ad6b7169203331";

/// An event whose shipment fails once: the ingest's server span, both ship
/// attempts and the confirmation, each with its client span, all in the
/// provider's trace; the downstream saw that trace in every `traceparent`.
#[tokio::test]
async fn one_trace_holds_the_event_from_webhook_to_every_downstream_call() {
    let mut stack = Stack::start(StackOptions {
        otlp: true,
        ..Default::default()
    })
    .await;
    stack.insert_order(41, "pay_41").await;
    stack
        .downstream
        .script("ship-41", [simulator::downstream::ScriptStep::Status(500)]);

    let traceparent = format!("00-{PROVIDER_TRACE}-{PROVIDER_SPAN}-01");
    let r = stack
        .post(
            &event("evt_traced", "payment.succeeded", "pay_41"),
            &[("traceparent", &traceparent)],
        )
        .await;
    assert_eq!(r.status(), 200);
    stack
        .wait_for(
            "SELECT count(*) FROM outbox WHERE status = 'done'",
            2,
            Duration::from_secs(60),
        )
        .await;
    let stored: String = stack
        .client
        .query_one(
            "SELECT trace_context FROM outbox WHERE idempotency_key = 'ship-41'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        stored.split('-').nth(1),
        Some(PROVIDER_TRACE),
        "the row stores the event's trace"
    );

    // Stopping flushes what is still batched.
    stack.ingest.stop(Duration::from_secs(10));
    stack.relay.stop(Duration::from_secs(60));

    let spans: Vec<_> = stack
        .otlp
        .as_ref()
        .unwrap()
        .spans()
        .into_iter()
        .filter(|s| s.trace_id == PROVIDER_TRACE)
        .collect();
    let server: Vec<_> = spans
        .iter()
        .filter(|s| s.service == "webhook-ingest" && s.kind == 2)
        .collect();
    assert_eq!(server.len(), 1, "one ingest server span: {spans:#?}");
    let server = server[0];
    assert_eq!(
        server.parent_span_id, PROVIDER_SPAN,
        "the provider's traceparent is continued"
    );
    assert_eq!(server.name, "POST /webhooks/payments");
    assert_eq!(server.attr("webhook.event_id"), Some("evt_traced"));
    assert_eq!(server.attr("webhook.event_type"), Some("payment.succeeded"));
    assert_eq!(server.attr("webhook.outcome"), Some("processed"));
    assert_eq!(server.attr("http.request.method"), Some("POST"));
    assert_eq!(server.attr("http.route"), Some("/webhooks/payments"));
    assert_eq!(server.attr("http.response.status_code"), Some("200"));
    for child in ["webhook.verify", "record_event"] {
        assert!(
            spans
                .iter()
                .any(|s| s.name == child && s.parent_span_id == server.span_id),
            "{child} under the server span"
        );
    }
    let db = spans.iter().find(|s| s.name == "record_event").unwrap();
    assert_eq!(db.attr("db.system.name"), Some("postgresql"));
    assert_eq!(db.kind, 3);

    let dispatches: Vec<_> = spans.iter().filter(|s| s.name == "outbox.dispatch").collect();
    assert_eq!(
        dispatches.len(),
        3,
        "two ship attempts and one confirmation: {dispatches:#?}"
    );
    let mut attempts: Vec<(String, String)> = Vec::new();
    for d in &dispatches {
        assert_eq!(d.service, "outbox-relay");
        assert_eq!(
            d.parent_span_id, server.span_id,
            "each attempt is a child of the ingest's span"
        );
        assert_eq!(d.attr("webhook.event_id"), Some("evt_traced"));
        assert!(d.attr("outbox.id").is_some());
        attempts.push((
            d.attr("idempotency_key").unwrap().to_owned(),
            d.attr("outbox.attempt").unwrap().to_owned(),
        ));
        let kind = d.attr("outbox.kind").unwrap();
        assert!(kind == "ship_order" || kind == "send_confirmation", "{kind}");
        let clients: Vec<_> = spans
            .iter()
            .filter(|s| s.parent_span_id == d.span_id && s.kind == 3)
            .collect();
        assert_eq!(clients.len(), 1, "one client span per attempt");
        assert_eq!(clients[0].attr("http.request.method"), Some("POST"));
    }
    attempts.sort();
    assert_eq!(
        attempts,
        [
            ("conf-41".into(), "1".into()),
            ("ship-41".into(), "1".into()),
            ("ship-41".into(), "2".into())
        ]
    );

    // The downstream received the trace, and each request named its client span.
    let stats = stack.downstream.stats();
    let client_ids: Vec<&str> = spans
        .iter()
        .filter(|s| s.kind == 3 && s.service == "outbox-relay")
        .map(|s| s.span_id.as_str())
        .collect();
    for key in ["ship-41", "conf-41"] {
        let k = stats.key(key);
        for tp in &k.traceparents {
            let parts: Vec<&str> = tp.split('-').collect();
            assert_eq!(parts[1], PROVIDER_TRACE, "{key}: {tp}");
            assert!(client_ids.contains(&parts[2]), "{key}: {tp} names a client span");
        }
        assert_eq!(k.traceparents.len() as u64, k.requests);
    }
    assert_eq!(stats.key("ship-41").requests, 2);
}

/// Only what is signed picks our trace: a request that fails verification,
/// whatever `traceparent` it sends (sampled or not), is traced in a fresh
/// root trace and its context is neither continued nor stored; the verified
/// delivery after it still continues the provider's trace, and its outbox
/// rows store it.
#[tokio::test]
async fn only_a_verified_delivery_continues_its_traceparent() {
    const FORGED_TRACE: &str = "5ee0f0f0f0f0f0f0f0f0f0f0f0f0f0f0";
    const UNSAMPLED_TRACE: &str = "0dd0f0f0f0f0f0f0f0f0f0f0f0f0f0f0";
    const FORGED_SPAN: &str = "a11ce0000000beef";
    const WRONG_SECRET: &str = "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let mut stack = Stack::start(StackOptions {
        otlp: true,
        ..Default::default()
    })
    .await;
    stack.insert_order(43, "pay_43").await;

    let body = event("evt_signed", "payment.succeeded", "pay_43");
    for forged in [
        format!("00-{FORGED_TRACE}-{FORGED_SPAN}-01"),
        format!("00-{UNSAMPLED_TRACE}-{FORGED_SPAN}-00"),
    ] {
        let r = stack
            .post_signed_with(&body, WRONG_SECRET, &[("traceparent", &forged)])
            .await;
        assert_eq!(r.status(), 401, "{forged}");
    }
    let traceparent = format!("00-{PROVIDER_TRACE}-{PROVIDER_SPAN}-01");
    let r = stack.post(&body, &[("traceparent", &traceparent)]).await;
    assert_eq!(r.status(), 200);
    let stored: Vec<String> = stack
        .client
        .query("SELECT trace_context FROM outbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(!stored.is_empty());
    for tp in &stored {
        assert_eq!(tp.split('-').nth(1), Some(PROVIDER_TRACE), "stored: {stored:?}");
    }

    // Stopping flushes what is still batched.
    stack.ingest.stop(Duration::from_secs(10));
    let spans = stack.otlp.as_ref().unwrap().spans();
    let forged: Vec<_> = spans
        .iter()
        .filter(|s| {
            s.trace_id == FORGED_TRACE || s.trace_id == UNSAMPLED_TRACE || s.parent_span_id == FORGED_SPAN
        })
        .collect();
    assert!(forged.is_empty(), "spans in a forged trace: {forged:#?}");
    let ingest: Vec<_> = spans.iter().filter(|s| s.service == "webhook-ingest").collect();
    let rejected: Vec<_> = ingest
        .iter()
        .filter(|s| s.kind == 2 && s.attr("http.response.status_code") == Some("401"))
        .collect();
    assert_eq!(
        rejected.len(),
        2,
        "each rejection traced as a root, the unsampled flag ignored: {ingest:#?}"
    );
    for r in &rejected {
        assert_eq!(r.parent_span_id, "", "a root span: {r:#?}");
        assert_ne!(r.trace_id, PROVIDER_TRACE);
        assert!(
            ingest.iter().any(|s| s.name == "webhook.verify"
                && s.parent_span_id == r.span_id
                && s.trace_id == r.trace_id),
            "webhook.verify under the rejected request's span: {ingest:#?}"
        );
    }
    assert_ne!(rejected[0].trace_id, rejected[1].trace_id);
    let server: Vec<_> = ingest
        .iter()
        .filter(|s| s.kind == 2 && s.trace_id == PROVIDER_TRACE)
        .collect();
    assert_eq!(server.len(), 1, "one verified server span: {ingest:#?}");
    assert_eq!(server[0].parent_span_id, PROVIDER_SPAN);
    assert_eq!(server[0].attr("http.response.status_code"), Some("200"));
    for child in ["webhook.verify", "record_event"] {
        assert!(
            ingest.iter().any(|s| s.name == child
                && s.trace_id == PROVIDER_TRACE
                && s.parent_span_id == server[0].span_id),
            "{child} under the verified server span: {ingest:#?}"
        );
    }
}

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
}
