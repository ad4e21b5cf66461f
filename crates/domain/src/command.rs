//! Outbox commands: what the ingest enqueues and the relay delivers.
//!
//! A command's idempotency key is derived from the order alone (`ship-<order>`),
//! never from the event: two distinct events for one order must not ship it
//! twice, and the downstream's own deduplication keys on the same value.
//!
//! The outbox row stores `kind` in its own column and the rest as a versioned
//! JSON payload ([`OutboxPayload`]). A relay reads rows written by an older
//! ingest, and during a rolling upgrade may meet rows from a newer one: it
//! must then leave them for a newer relay instead of guessing
//! ([`PayloadError::UnsupportedVersion`] is retryable, not fatal).

use serde::{Deserialize, Serialize};

/// The payload version this release writes. Bump it when the payload changes
/// shape, and keep decoding every older version.
pub const PAYLOAD_VERSION: i32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CommandKind {
    ShipOrder,
    SendConfirmation,
    SendRefundNotice,
}

/// Where a command's outbox row stands (`outbox.status`): the schema allows
/// these four and no other. The ingest writes `pending` (and `cancelled` when
/// a refund stops a shipment), the relay `done`, `dead` or `pending` again;
/// the relay, its operator commands and the audit read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutboxStatus {
    /// Waiting to be sent: due, leased, or waiting out a retry's backoff.
    Pending,
    Done,
    /// Waiting for an operator (`dead list`, `dead requeue`).
    Dead,
    /// Stopped by a refund before it was sent (only shipments).
    Cancelled,
}

impl OutboxStatus {
    pub const ALL: [OutboxStatus; 4] = [Self::Pending, Self::Done, Self::Dead, Self::Cancelled];

    /// The `outbox.status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Done => "done",
            Self::Dead => "dead",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }
}

/// Which downstream API a command goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Fulfilment,
    Email,
}

impl CommandKind {
    pub const ALL: [CommandKind; 3] = [Self::ShipOrder, Self::SendConfirmation, Self::SendRefundNotice];

    /// The `outbox.kind` column and the `kind` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ShipOrder => "ship_order",
            Self::SendConfirmation => "send_confirmation",
            Self::SendRefundNotice => "send_refund_notice",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The idempotency key's prefix; the key is `<prefix>-<order_id>`.
    pub fn key_prefix(self) -> &'static str {
        match self {
            Self::ShipOrder => "ship",
            Self::SendConfirmation => "conf",
            Self::SendRefundNotice => "refund",
        }
    }

    pub fn idempotency_key(self, order_id: i64) -> String {
        format!("{}-{order_id}", self.key_prefix())
    }

    pub fn endpoint(self) -> Endpoint {
        match self {
            Self::ShipOrder => Endpoint::Fulfilment,
            Self::SendConfirmation | Self::SendRefundNotice => Endpoint::Email,
        }
    }

    /// Path appended to the endpoint's base URL.
    pub fn path(self) -> &'static str {
        match self.endpoint() {
            Endpoint::Fulfilment => "/shipments",
            Endpoint::Email => "/emails",
        }
    }

    fn template(self) -> Option<&'static str> {
        match self {
            Self::ShipOrder => None,
            Self::SendConfirmation => Some("order_confirmation"),
            Self::SendRefundNotice => Some("refund_notice"),
        }
    }
}

/// One effect to cause downstream, exactly once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub kind: CommandKind,
    pub order_id: i64,
    /// The event that caused it: for the trace, the logs and the downstream's records.
    pub event_id: String,
}

/// The JSON stored in `outbox.payload`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxPayload {
    pub v: i32,
    pub order_id: i64,
    pub event_id: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PayloadError {
    #[error("unknown command kind `{0}`")]
    UnknownKind(String),
    /// Written by a newer release; a newer relay will deliver it.
    #[error("payload version {0} is newer than this release understands ({PAYLOAD_VERSION})")]
    UnsupportedVersion(i64),
    #[error("invalid payload: {0}")]
    Invalid(String),
}

impl PayloadError {
    /// Whether another relay (a newer release) could still deliver the row.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::UnsupportedVersion(_))
    }
}

#[derive(Serialize)]
struct RequestBody<'a> {
    order_id: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    template: Option<&'static str>,
    event_id: &'a str,
}

impl Command {
    pub fn idempotency_key(&self) -> String {
        self.kind.idempotency_key(self.order_id)
    }

    pub fn payload(&self) -> OutboxPayload {
        OutboxPayload {
            v: PAYLOAD_VERSION,
            order_id: self.order_id,
            event_id: self.event_id.clone(),
        }
    }

    /// Reads an outbox row's `kind` and `payload` columns.
    pub fn decode(kind: &str, payload: &serde_json::Value) -> Result<Self, PayloadError> {
        let kind = CommandKind::parse(kind).ok_or_else(|| PayloadError::UnknownKind(kind.to_owned()))?;
        Self::from_payload(kind, payload)
    }

    /// Reads an outbox row's `payload`, its `kind` already decoded (the
    /// relay decodes the kind once, when it claims the row).
    pub fn from_payload(kind: CommandKind, payload: &serde_json::Value) -> Result<Self, PayloadError> {
        let version = payload
            .get("v")
            .and_then(serde_json::Value::as_i64)
            .ok_or_else(|| PayloadError::Invalid("no integer `v`".into()))?;
        match version {
            1 => {
                let p: OutboxPayload = serde_json::from_value(payload.clone())
                    .map_err(|e| PayloadError::Invalid(e.to_string()))?;
                Ok(Self {
                    kind,
                    order_id: p.order_id,
                    event_id: p.event_id,
                })
            }
            v if v > i64::from(PAYLOAD_VERSION) => Err(PayloadError::UnsupportedVersion(v)),
            v => Err(PayloadError::Invalid(format!("unknown payload version {v}"))),
        }
    }

    /// The downstream request body: the same bytes on every attempt, since a
    /// downstream rejects a reused idempotency key with a different body.
    pub fn request_body(&self) -> Vec<u8> {
        serde_json::to_vec(&RequestBody {
            order_id: self.order_id,
            template: self.kind.template(),
            event_id: &self.event_id,
        })
        .expect("a struct of integers and strings always serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn cmd(kind: CommandKind) -> Command {
        Command {
            kind,
            order_id: 88214,
            event_id: "evt_1K9x".into(),
        }
    }

    #[test]
    fn keys_per_order() {
        assert_eq!(cmd(CommandKind::ShipOrder).idempotency_key(), "ship-88214");
        assert_eq!(cmd(CommandKind::SendConfirmation).idempotency_key(), "conf-88214");
        assert_eq!(
            cmd(CommandKind::SendRefundNotice).idempotency_key(),
            "refund-88214"
        );
        let mut other_event = cmd(CommandKind::ShipOrder);
        other_event.event_id = "evt_other".into();
        assert_eq!(other_event.idempotency_key(), "ship-88214");
    }

    #[test]
    fn kinds_round_trip_and_route() {
        for kind in CommandKind::ALL {
            assert_eq!(CommandKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(CommandKind::parse("ShipOrder"), None);
        assert_eq!(CommandKind::ShipOrder.path(), "/shipments");
        assert_eq!(CommandKind::SendConfirmation.path(), "/emails");
        assert_eq!(CommandKind::SendRefundNotice.path(), "/emails");
        assert_eq!(CommandKind::ShipOrder.endpoint(), Endpoint::Fulfilment);
    }

    #[test]
    fn request_bodies_are_the_spec_shapes() {
        let body = |k| serde_json::from_slice::<serde_json::Value>(&cmd(k).request_body()).unwrap();
        assert_eq!(
            body(CommandKind::ShipOrder),
            json!({"order_id": 88214, "event_id": "evt_1K9x"})
        );
        assert_eq!(
            body(CommandKind::SendConfirmation),
            json!({"order_id": 88214, "template": "order_confirmation", "event_id": "evt_1K9x"})
        );
        assert_eq!(
            body(CommandKind::SendRefundNotice),
            json!({"order_id": 88214, "template": "refund_notice", "event_id": "evt_1K9x"})
        );
        // Stable bytes, not just equal JSON.
        assert_eq!(
            cmd(CommandKind::ShipOrder).request_body(),
            br#"{"order_id":88214,"event_id":"evt_1K9x"}"#
        );
    }

    #[test]
    fn payload_v1_is_the_documented_shape() {
        let c = cmd(CommandKind::SendConfirmation);
        let encoded = serde_json::to_value(c.payload()).unwrap();
        assert_eq!(
            encoded,
            json!({"v": 1, "order_id": 88214, "event_id": "evt_1K9x"})
        );
        assert_eq!(Command::decode("send_confirmation", &encoded).unwrap(), c);
    }

    #[test]
    fn decode_tolerates_extra_fields() {
        let p = json!({"v": 1, "order_id": 5, "event_id": "e", "added_later": true});
        assert_eq!(Command::decode("ship_order", &p).unwrap().order_id, 5);
    }

    #[test]
    fn decode_errors() {
        let ok = json!({"v": 1, "order_id": 5, "event_id": "e"});
        assert_eq!(
            Command::decode("fly", &ok),
            Err(PayloadError::UnknownKind("fly".into()))
        );
        assert_eq!(
            Command::from_payload(CommandKind::ShipOrder, &ok),
            Command::decode("ship_order", &ok)
        );
        let newer = json!({"v": 2, "whatever": 1});
        let err = Command::decode("ship_order", &newer).unwrap_err();
        assert_eq!(err, PayloadError::UnsupportedVersion(2));
        assert!(err.is_retryable());
        for bad in [
            json!({}),
            json!({"v": "1"}),
            json!({"v": 0}),
            json!({"v": 1, "order_id": "5", "event_id": "e"}),
            json!({"v": 1, "event_id": "e"}),
        ] {
            let err = Command::decode("ship_order", &bad).unwrap_err();
            assert!(matches!(err, PayloadError::Invalid(_)), "{bad}: {err:?}");
            assert!(!err.is_retryable());
        }
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(order_id in any::<i64>(), event_id in ".{0,64}", k in 0usize..3) {
            let c = Command { kind: CommandKind::ALL[k], order_id, event_id };
            let v = serde_json::to_value(c.payload()).unwrap();
            prop_assert_eq!(&Command::decode(c.kind.as_str(), &v).unwrap(), &c);
            let body: serde_json::Value = serde_json::from_slice(&c.request_body()).unwrap();
            prop_assert_eq!(body["order_id"].as_i64(), Some(order_id));
        }
    }
}
