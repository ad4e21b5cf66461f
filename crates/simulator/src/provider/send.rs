//! One event, signed and posted once, by hand (`simulator send`): what an
//! operator or a newcomer uses to watch one webhook go through, with the
//! provider's own signing and posting.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use bytes::Bytes;
use reqwest::Url;
use reqwest::header::HeaderValue;

use super::config::{ProviderConfig, endpoint};
use super::delivery::Sender;
use super::stats::NoAnswer;
use signature::{Scheme, Secret};

/// The event to send; the body is `{"id", "type", "created", "data":
/// {"payment_id", "amount", "currency": "gbp"}}`.
#[derive(Debug, Clone)]
pub struct HandEvent {
    /// The ingest's dedup key: the same id again is a redelivery.
    pub id: String,
    pub event_type: String,
    pub payment_id: String,
    pub amount: i64,
}

/// The ingest's answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// `Idempotent-Replayed: true`: the stored answer to an earlier delivery.
    pub replayed: bool,
    pub body: Bytes,
}

/// Posts `event` once to `target` (a base URL gets the webhook path),
/// signed now; no retry.
pub async fn send_once(
    target: &Url,
    scheme: Scheme,
    secret: Secret,
    event: &HandEvent,
) -> anyhow::Result<Reply> {
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // serde, not a format string: the id and type come from a person.
    let body = Bytes::from(serde_json::to_vec(&serde_json::json!({
        "id": event.id,
        "type": event.event_type,
        "created": created,
        "data": {"payment_id": event.payment_id, "amount": event.amount, "currency": "gbp"},
    }))?);
    let webhook_id = HeaderValue::try_from(format!("msg_{}", event.id))
        .with_context(|| format!("--id {:?} cannot be sent in a header", event.id))?;
    let config = ProviderConfig::new(vec![target.clone()], scheme, secret);
    let sender = Sender::new(&config)?;
    let timeout = config.timeout;
    let answer = sender
        .attempt(&webhook_id, &body, &endpoint(target), timeout)
        .await
        .map_err(|why| match why {
            NoAnswer::Timeout => anyhow::anyhow!("{target}: no answer within {timeout:?}"),
            NoAnswer::Connection => anyhow::anyhow!("{target}: could not connect, or the connection dropped"),
        })?;
    Ok(Reply {
        status: answer.status,
        replayed: answer.replayed,
        body: answer.body,
    })
}
