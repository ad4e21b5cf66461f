//! One trace per event across both services (here), metrics equal to the
//! workload and logs that carry the event's ids and never a secret
//! (`metrics_and_logs`).

use std::time::Duration;

use harness::{ReceivedSpan, SECRET, Stack, StackOptions, event};

use crate::harness;

mod metrics_and_logs;

const PROVIDER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const PROVIDER_SPAN: &str = "b7ad6b7169203331";
const PROVIDER_AGENT: &str = "provider-webhooks/2.1 (+https://provider.example/webhooks)";

/// The client span of a payment's record statement: its name is the
/// statement's summary, every operation on a table in the order it runs them.
const RECORD_PAYMENT: &str = "UPDATE public.processed_events SELECT public.orders \
     INSERT public.processed_events UPDATE public.orders INSERT public.outbox";
/// The relay's claim, its recording of verdicts, its recheck of a shipment.
const CLAIM: &str = "SELECT public.outbox UPDATE public.outbox";
const RECORD_VERDICTS: &str = "UPDATE public.outbox";
const STILL_PENDING: &str = "SELECT public.outbox";

/// What every database client span says of where its statement went, and
/// that it is one.
fn assert_database_span(span: &ReceivedSpan, stack: &Stack) {
    assert_eq!(span.kind, 3, "a client span: {span:#?}");
    assert_eq!(span.attr("db.system.name"), Some("postgresql"), "{span:#?}");
    assert_eq!(
        span.attr("db.namespace"),
        Some(stack._db.name.as_str()),
        "{span:#?}"
    );
    assert_eq!(
        span.attr("db.query.summary"),
        Some(span.name.as_str()),
        "{span:#?}"
    );
    assert_eq!(span.attr("server.address"), Some("127.0.0.1"), "{span:#?}");
    assert_eq!(
        span.int("server.port"),
        Some(i64::from(testkit::port_of(&stack._db.url))),
        "{span:#?}"
    );
}

/// An event whose shipment fails once: the ingest's server span (with the
/// provider's address and user agent, and nothing of its signature or body),
/// its record statement's client span, both ship attempts and the
/// confirmation, each with its client span (the second ship call counted as
/// a resend), all in the provider's trace; the downstream saw that trace in
/// every `traceparent`. The relay's claims and recordings have client spans
/// of their own, and every span names the service's version.
#[tokio::test]
async fn one_trace_holds_the_event_from_webhook_to_every_downstream_call() {
    let (stack, all) = one_traced_payment_with_a_retried_shipment().await;
    no_secret_or_body_in_a_span(&all);
    let spans: Vec<_> = all
        .iter()
        .filter(|s| s.trace_id == PROVIDER_TRACE)
        .cloned()
        .collect();
    let server = the_ingest_span_continues_the_provider_trace(&spans, &stack);
    the_relays_statements_are_roots_naming_their_table(&all, &stack);
    each_attempt_is_a_child_of_the_ingest_span(&spans, server);
    the_downstream_received_the_trace(&spans, &stack);
}

/// Order 41's payment, traced by its provider, whose shipment fails once
/// (500) and is retried; the stack stopped, so every span is flushed.
async fn one_traced_payment_with_a_retried_shipment() -> (Stack, Vec<ReceivedSpan>) {
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
            &[("traceparent", &traceparent), ("user-agent", PROVIDER_AGENT)],
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

    // Two seconds idle: ten poll ticks of the relay's (200 ms), which send
    // no claim spans (below).
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Stopping flushes what is still batched.
    stack.ingest.stop(Duration::from_secs(10));
    stack.relay.stop(Duration::from_secs(60));

    let all = stack.otlp.as_ref().unwrap().spans();
    (stack, all)
}

/// Every span names the build, and none carries the signature or the body.
fn no_secret_or_body_in_a_span(all: &[ReceivedSpan]) {
    for s in all {
        assert_eq!(
            s.resource.get("service.version").map(String::as_str),
            Some(env!("CARGO_PKG_VERSION")),
            "the resource names the build: {s:#?}"
        );
        for (key, value) in &s.attributes {
            assert!(
                !key.contains("signature") && !value.contains("v1,"),
                "a signature in a span: {key}={value}"
            );
            assert!(
                !value.contains("\"amount\"") && !value.contains("pay_41"),
                "the body in a span: {key}={value}"
            );
        }
    }
}

/// One server span for the delivery, continuing the provider's traceparent,
/// with the event's attributes, the verification and the recording under it.
fn the_ingest_span_continues_the_provider_trace<'a>(
    spans: &'a [ReceivedSpan],
    stack: &Stack,
) -> &'a ReceivedSpan {
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
    assert_eq!(server.int("http.response.status_code"), Some(200));
    assert_eq!(server.attr("client.address"), Some("127.0.0.1"));
    assert_eq!(server.attr("user_agent.original"), Some(PROVIDER_AGENT));
    for child in ["webhook.verify", RECORD_PAYMENT] {
        assert!(
            spans
                .iter()
                .any(|s| s.name == child && s.parent_span_id == server.span_id),
            "{child} under the server span: {spans:#?}"
        );
    }
    let db = spans.iter().find(|s| s.name == RECORD_PAYMENT).unwrap();
    assert_database_span(db, stack);
    // Several operations on several tables: neither is one name.
    assert_eq!(db.attr("db.operation.name"), None);
    assert_eq!(db.attr("db.collection.name"), None);
    assert_eq!((db.status, db.attr("error.type")), (0, None), "it succeeded");

    server
}

/// The relay's own statements: roots of their own traces.
fn the_relays_statements_are_roots_naming_their_table(all: &[ReceivedSpan], stack: &Stack) {
    // The relay's own statements: roots of their own traces (their rows
    // are of many events), each naming its one table.
    let claims: Vec<_> = all.iter().filter(|s| s.name == CLAIM).collect();
    let recordings: Vec<_> = all.iter().filter(|s| s.name == RECORD_VERDICTS).collect();
    for s in claims.iter().chain(&recordings) {
        assert_eq!(s.service, "outbox-relay");
        assert_eq!(s.parent_span_id, "", "a root: {s:#?}");
        assert_database_span(s, stack);
        assert_eq!(s.attr("db.collection.name"), Some("public.outbox"));
        assert_eq!(s.status, 0, "{s:#?}");
    }
    assert!(
        claims.iter().all(|s| s.attr("db.operation.name").is_none()),
        "a claim selects and updates"
    );
    assert!(
        recordings
            .iter()
            .all(|s| s.attr("db.operation.name") == Some("UPDATE"))
    );
    let rows = |spans: &[&ReceivedSpan]| -> i64 {
        spans
            .iter()
            .map(|s| s.int("db.response.returned_rows").unwrap())
            .sum()
    };
    // The shipment and the confirmation are claimed once each, the
    // shipment's retry once more: at most three rows in traced claims. Any
    // of those claims may be untraced: one made at a poll tick after an
    // empty claim has no span, and the tick can fall between the ingest's
    // commit and its NOTIFY reaching the relay (seen once: all three rows
    // claimed so). The recordings below are always traced and count 3.
    let claimed = rows(&claims);
    assert!(
        claimed <= 3,
        "{claimed} rows claimed in traced claims: {claims:#?}"
    );
    // An idle relay's poll ticks send no claim span: of the empty claims,
    // only those after a NOTIFY or a claim that found rows have one (a
    // handful, where the seconds idle above alone held ten ticks, and the
    // whole test some twenty-five).
    let empty = claims
        .iter()
        .filter(|s| s.int("db.response.returned_rows") == Some(0))
        .count();
    assert!(empty <= 8, "{empty} empty claims traced: {claims:#?}");
    assert_eq!(rows(&recordings), 3, "three verdicts recorded: {recordings:#?}");
}

/// Two ship attempts and one confirmation, each a child of the ingest's
/// span, with one client span each.
fn each_attempt_is_a_child_of_the_ingest_span(spans: &[ReceivedSpan], server: &ReceivedSpan) {
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
        assert!(clients[0].int("server.port").is_some(), "{:#?}", clients[0]);
        // The same request (key and body) again from the second attempt on.
        let resends = d.attr("outbox.attempt").unwrap().parse::<i64>().unwrap() - 1;
        assert_eq!(
            clients[0].int("http.request.resend_count"),
            (resends > 0).then_some(resends),
            "{:#?}",
            clients[0]
        );
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
}

/// The downstream received the trace, and each request named its client span.
fn the_downstream_received_the_trace(spans: &[ReceivedSpan], stack: &Stack) {
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

/// A statement that fails says so on its span: a payment whose order the
/// shop holds locked past the session's `lock_timeout` fails with
/// `lock_not_available`, and each such try's client span has status error,
/// with the SQLSTATE as `db.response.status_code` and `error.type`; the try
/// once the lock is gone succeeds, in a span without them.
#[tokio::test]
async fn a_failed_statement_says_its_sqlstate_on_its_span() {
    const TRACE: &str = "0c0c7651916cd43dd8448eb211c80319";
    let mut stack = Stack::start(StackOptions {
        otlp: true,
        ..Default::default()
    })
    .await;
    stack.insert_order(42, "pay_42").await;
    let shop = testkit::TestDb::connect_url(&stack._db.url).await;
    shop.batch_execute("BEGIN; SELECT 1 FROM orders WHERE id = 42 FOR UPDATE")
        .await
        .unwrap();

    let delivery = {
        let (http, url) = (stack.http.clone(), stack.ingest_url.clone());
        let traceparent = format!("00-{TRACE}-{PROVIDER_SPAN}-01");
        let body = event("evt_locked", "payment.succeeded", "pay_42");
        tokio::spawn(async move {
            harness::post_signed(&http, &url, &body, SECRET, &[("traceparent", &traceparent)])
                .await
                .status()
        })
    };
    // The lock goes once a try has failed on it (the ingest counts each).
    let started = std::time::Instant::now();
    while stack
        .metrics(&stack.ingest_admin)
        .await
        .get("webhook_order_lock_waits_total", &[])
        < 1.0
    {
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "no try failed on the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shop.batch_execute("COMMIT").await.unwrap();
    assert_eq!(delivery.await.unwrap(), 200, "recorded once the lock went");
    stack.ingest.stop(Duration::from_secs(10));

    let spans: Vec<_> = stack
        .otlp
        .as_ref()
        .unwrap()
        .spans()
        .into_iter()
        .filter(|s| s.trace_id == TRACE)
        .collect();
    let server = spans.iter().find(|s| s.kind == 2).expect("the server span");
    let tries: Vec<_> = spans.iter().filter(|s| s.name == RECORD_PAYMENT).collect();
    for t in &tries {
        assert_database_span(t, &stack);
        assert_eq!(t.parent_span_id, server.span_id, "{t:#?}");
    }
    let (failed, succeeded): (Vec<&&ReceivedSpan>, Vec<_>) = tries.iter().partition(|s| s.status == 2);
    assert!(!failed.is_empty(), "a try failed: {tries:#?}");
    for f in &failed {
        assert_eq!(
            f.attr("db.response.status_code"),
            Some("55P03"),
            "lock_not_available: {f:#?}"
        );
        assert_eq!(f.attr("error.type"), Some("55P03"), "{f:#?}");
    }
    assert_eq!(succeeded.len(), 1, "one try succeeded: {tries:#?}");
    assert_eq!(succeeded[0].status, 0);
    assert_eq!(
        (
            succeeded[0].attr("error.type"),
            succeeded[0].attr("db.response.status_code")
        ),
        (None, None)
    );
}

/// A shipment that waited for a call slot is checked before it is sent (a
/// refund may have cancelled it meanwhile): that statement's client span is
/// in the shipment's event's trace, under the ingest's span, as the attempts
/// are.
#[tokio::test]
async fn the_recheck_of_a_waiting_shipment_is_in_its_events_trace() {
    const TRACE: &str = "0d0d7651916cd43dd8448eb211c80319";
    let mut stack = Stack::start(StackOptions {
        otlp: true,
        relay_env: vec![
            ("RELAY_CONCURRENCY", "1".into()),
            ("RELAY_HTTP_TIMEOUT_MS", "1000".into()),
        ],
        ..Default::default()
    })
    .await;
    stack.insert_order(51, "pay_51").await;
    stack.insert_order(52, "pay_52").await;
    // Order 51's calls hold the one call slot for a second each.
    for key in ["ship-51", "conf-51"] {
        stack
            .downstream
            .script(key, [simulator::downstream::ScriptStep::Hang]);
    }
    let r = stack
        .post(&event("evt_51", "payment.succeeded", "pay_51"), &[])
        .await;
    assert_eq!(r.status(), 200);
    let started = std::time::Instant::now();
    while stack.downstream.stats().requests == 0 {
        assert!(started.elapsed() < Duration::from_secs(20), "no call made");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let traceparent = format!("00-{TRACE}-{PROVIDER_SPAN}-01");
    let r = stack
        .post(
            &event("evt_52", "payment.succeeded", "pay_52"),
            &[("traceparent", &traceparent)],
        )
        .await;
    assert_eq!(r.status(), 200);
    stack
        .wait_for(
            "SELECT count(*) FROM outbox WHERE status = 'done'",
            4,
            Duration::from_secs(60),
        )
        .await;
    stack.ingest.stop(Duration::from_secs(10));
    stack.relay.stop(Duration::from_secs(60));

    let spans: Vec<_> = stack
        .otlp
        .as_ref()
        .unwrap()
        .spans()
        .into_iter()
        .filter(|s| s.trace_id == TRACE)
        .collect();
    let server = spans
        .iter()
        .find(|s| s.kind == 2)
        .expect("the ingest's server span");
    let rechecks: Vec<_> = spans.iter().filter(|s| s.name == STILL_PENDING).collect();
    assert!(
        !rechecks.is_empty(),
        "ship-52 waited and was rechecked: {spans:#?}"
    );
    for r in &rechecks {
        assert_eq!(r.service, "outbox-relay");
        assert_eq!(r.parent_span_id, server.span_id, "{r:#?}");
        assert_database_span(r, &stack);
        assert_eq!(r.attr("db.operation.name"), Some("SELECT"));
        assert_eq!(r.attr("db.collection.name"), Some("public.outbox"));
        assert_eq!(r.status, 0, "{r:#?}");
    }
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

    // Two seconds idle: ten poll ticks of the relay's (200 ms), which send
    // no claim spans (below).
    tokio::time::sleep(Duration::from_secs(2)).await;
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
    for child in ["webhook.verify", RECORD_PAYMENT] {
        assert!(
            ingest.iter().any(|s| s.name == child
                && s.trace_id == PROVIDER_TRACE
                && s.parent_span_id == server[0].span_id),
            "{child} under the verified server span: {ingest:#?}"
        );
    }
}
