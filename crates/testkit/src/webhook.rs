//! A provider's side of a delivery, as every test that posts to the ingest
//! writes it: the event's body, its Standard Webhooks signature, the POST,
//! and the shop's order it is for.

use std::time::{SystemTime, UNIX_EPOCH};

/// The secret the tests' services are started with (`WEBHOOK_SECRETS`).
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A payment provider's event body: `kind` for `payment_id`, 42.00 GBP.
pub fn event(id: &str, kind: &str, payment_id: &str) -> String {
    format!(
        r#"{{"id":"{id}","type":"{kind}","created":1700000000,"data":{{"payment_id":"{payment_id}","amount":4200,"currency":"gbp"}}}}"#
    )
}

/// Seconds since the epoch, as a signature's timestamp.
pub fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// Standard Webhooks headers for `body`, signed with `secret` at `ts`.
pub fn standard_headers(secret: &str, ts: i64, body: &str) -> Vec<(&'static str, String)> {
    let key = signature::Secret::parse(signature::Scheme::Standard, secret).unwrap();
    let msg_id = format!("msg_{ts}_{}", body.len());
    let signed = signature::sign_standard(&key, &msg_id, ts, body.as_bytes());
    vec![
        ("webhook-id", msg_id),
        ("webhook-timestamp", ts.to_string()),
        ("webhook-signature", signed),
    ]
}

/// POSTs `body` to the ingest's webhook `endpoint` (its URL and
/// `webhook_ingest::http::WEBHOOK_PATH`) with `headers`; the transport's
/// error (a timeout, a refused connection) is the caller's to retry on, as
/// a provider does.
pub async fn post(
    http: &reqwest::Client,
    endpoint: &str,
    body: &str,
    headers: &[(&str, String)],
) -> reqwest::Result<reqwest::Response> {
    let mut req = http
        .post(endpoint)
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    req.send().await
}

/// The shop's order `id`, paid by `payment_id`, in `status`.
pub async fn insert_order(client: &tokio_postgres::Client, id: i64, payment_id: &str, status: &str) {
    client
        .execute(
            "INSERT INTO orders (id, payment_id, status) VALUES ($1, $2, $3)",
            &[&id, &payment_id, &status],
        )
        .await
        .unwrap();
}
