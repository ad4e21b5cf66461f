//! Every signature failure is a 401 that writes nothing at all.

use crate::helpers::{
    OTHER_SECRET, SECRET, STRIPE_SECRET, TestApp, event, now, spawn_app, spawn_app_with, standard_headers,
};

async fn assert_rejected(app: &TestApp, body: &str, headers: &[(&'static str, String)], why: &str) {
    let r = app.post_with(body, headers).await;
    assert_eq!(r.status(), 401, "{why}");
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{why}: {v}");
    assert_eq!(
        app.written().await,
        (0, 0),
        "{why}: nothing written, not even a dedup row"
    );
    assert_eq!(app.order_status(1).await, "pending", "{why}");
}

fn without(headers: &[(&'static str, String)], name: &str) -> Vec<(&'static str, String)> {
    headers.iter().filter(|(k, _)| *k != name).cloned().collect()
}

fn replace(
    headers: &[(&'static str, String)],
    name: &'static str,
    value: &str,
) -> Vec<(&'static str, String)> {
    let mut h = without(headers, name);
    h.push((name, value.to_owned()));
    h
}

#[tokio::test]
async fn every_signature_failure_is_401_and_writes_nothing() {
    let app = spawn_app().await;
    app.insert_order(1, "pay_1", "pending").await;
    let body = event("evt_sig", "payment.succeeded", "pay_1");
    let good = standard_headers(SECRET, now(), &body);

    assert_rejected(
        &app,
        &body,
        &standard_headers(OTHER_SECRET, now(), &body),
        "wrong secret",
    )
    .await;
    let tampered = body.replace("4200", "4201");
    assert_rejected(&app, &tampered, &good, "tampered body").await;
    assert_rejected(
        &app,
        &body,
        &standard_headers(SECRET, now() - 301, &body),
        "stale timestamp",
    )
    .await;
    assert_rejected(
        &app,
        &body,
        &standard_headers(SECRET, now() + 301, &body),
        "future timestamp",
    )
    .await;
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        assert_rejected(&app, &body, &without(&good, name), &format!("missing {name}")).await;
    }
    assert_rejected(&app, &body, &[], "no headers at all").await;
    assert_rejected(
        &app,
        &body,
        &replace(&good, "webhook-timestamp", "yesterday"),
        "garbled timestamp",
    )
    .await;
    assert_rejected(
        &app,
        &body,
        &replace(&good, "webhook-signature", "v1,%%%not-base64%%%"),
        "garbled signature",
    )
    .await;
    assert_rejected(
        &app,
        &body,
        &replace(&good, "webhook-signature", "v2,abc"),
        "no v1 entry",
    )
    .await;
    assert_rejected(
        &app,
        &body,
        &replace(&good, "webhook-signature", ""),
        "empty signature",
    )
    .await;
    assert_rejected(
        &app,
        &body,
        &replace(&good, "webhook-id", "msg_other"),
        "id not the signed one",
    )
    .await;

    // The genuine delivery still goes through afterwards.
    let r = app.post_with(&body, &good).await;
    assert_eq!(r.status(), 200);
}

/// A forged delivery carrying a real event's id must not claim the id, or the
/// real event would be replayed a result it never had.
#[tokio::test]
async fn a_forged_delivery_does_not_suppress_the_real_event() {
    let app = spawn_app().await;
    app.insert_order(1, "pay_1", "pending").await;
    let forged = event("evt_real", "customer.created", "pay_x");
    assert_rejected(
        &app,
        &forged,
        &standard_headers(OTHER_SECRET, now(), &forged),
        "forged",
    )
    .await;

    let real = event("evt_real", "payment.succeeded", "pay_1");
    let r = app.post(&real).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("idempotent-replayed").is_none());
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["status"], "processed");
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE kind = 'ship_order'")
            .await,
        1
    );
}

#[tokio::test]
async fn any_configured_secret_verifies_during_a_rotation() {
    let secrets = format!("{OTHER_SECRET},{SECRET}");
    let app = spawn_app_with(&["--webhook-secrets", &secrets]).await;
    app.insert_order(1, "pay_1", "pending").await;
    app.insert_order(2, "pay_2", "pending").await;
    let a = event("evt_old_key", "payment.succeeded", "pay_1");
    let b = event("evt_new_key", "payment.succeeded", "pay_2");
    assert_eq!(
        app.post_with(&a, &standard_headers(OTHER_SECRET, now(), &a))
            .await
            .status(),
        200
    );
    assert_eq!(
        app.post_with(&b, &standard_headers(SECRET, now(), &b))
            .await
            .status(),
        200
    );
    let c = event("evt_unknown_key", "payment.succeeded", "pay_1");
    let h = standard_headers("whsec_WFlaWFlaWFlaWFlaWFlaWA==", now(), &c);
    assert_eq!(app.post_with(&c, &h).await.status(), 401);
    assert_eq!(app.count("SELECT count(*) FROM processed_events").await, 2);
}

fn stripe_header(secret: &str, ts: i64, body: &str) -> Vec<(&'static str, String)> {
    let key = signature::Secret::parse(signature::Scheme::Stripe, secret).unwrap();
    vec![(
        "stripe-signature",
        signature::sign_stripe(&key, ts, body.as_bytes()),
    )]
}

#[tokio::test]
async fn the_stripe_scheme() {
    let app = spawn_app_with(&[
        "--webhook-signature-scheme",
        "stripe",
        "--webhook-secrets",
        STRIPE_SECRET,
    ])
    .await;
    app.insert_order(1, "pay_1", "pending").await;
    let body = event("evt_stripe", "payment.succeeded", "pay_1");

    assert_rejected(
        &app,
        &body,
        &standard_headers(SECRET, now(), &body),
        "standard headers on a stripe endpoint",
    )
    .await;
    assert_rejected(
        &app,
        &body,
        &stripe_header("sk_other", now(), &body),
        "wrong secret",
    )
    .await;
    assert_rejected(
        &app,
        &body,
        &stripe_header(STRIPE_SECRET, now() - 301, &body),
        "stale",
    )
    .await;
    assert_rejected(
        &app,
        &body,
        &stripe_header(STRIPE_SECRET, now() + 301, &body),
        "future",
    )
    .await;
    assert_rejected(
        &app,
        &body.replace("gbp", "eur"),
        &stripe_header(STRIPE_SECRET, now(), &body),
        "tampered",
    )
    .await;
    assert_rejected(&app, &body, &[("stripe-signature", "t=,v1=".into())], "garbled").await;

    let r = app
        .post_with(&body, &stripe_header(STRIPE_SECRET, now(), &body))
        .await;
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["status"], "processed");
}
