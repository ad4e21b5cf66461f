//! The provider's event, parsed from a body whose signature has already been
//! verified. Parsing is lenient about everything we do not use (unknown fields,
//! the shape of `data` for types we ignore) and strict about what we key on.

use serde::Deserialize;

/// Longest `id` or `type` accepted. The id is a primary key; an unbounded one
/// would let a single (signed) request fail the b-tree's row size limit with a
/// 500 instead of a clean 400. Real providers use ids of 20 to 40 characters.
pub const MAX_ID_LEN: usize = 255;

/// The event types this product acts on. Anything else is recorded and
/// acknowledged as `ignored`, so the provider stops retrying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    PaymentSucceeded,
    PaymentRefunded,
    Other,
}

impl EventKind {
    pub fn from_type(event_type: &str) -> Self {
        match event_type {
            "payment.succeeded" => Self::PaymentSucceeded,
            "payment.refunded" => Self::PaymentRefunded,
            _ => Self::Other,
        }
    }
}

/// A verified event: the dedup key, its type and the payment it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderEvent {
    /// The provider's event id: the dedup key.
    pub id: String,
    pub event_type: String,
    pub kind: EventKind,
    /// `data.payment_id`, when present and a string. An event of a known type
    /// without one is recorded as `unmatched` rather than rejected: a 400 would
    /// make the provider retry for days something no retry can fix.
    pub payment_id: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EventError {
    #[error("body is not a JSON object: {0}")]
    NotJson(String),
    #[error("event has no string `id`")]
    MissingId,
    #[error("event has no string `type`")]
    MissingType,
    #[error("event `{field}` is longer than {MAX_ID_LEN} bytes")]
    TooLong { field: &'static str },
    #[error("event `{field}` is empty")]
    Empty { field: &'static str },
    #[error("event contains a NUL character (\\u0000), which cannot be stored")]
    NulCharacter,
}

#[derive(Deserialize)]
struct Wire {
    id: Option<serde_json::Value>,
    #[serde(rename = "type")]
    event_type: Option<serde_json::Value>,
    data: Option<serde_json::Value>,
}

impl ProviderEvent {
    /// Parses a verified body. The raw bytes are kept by the caller: they are
    /// what is stored, not a re-serialisation.
    pub fn parse(body: &[u8]) -> Result<Self, EventError> {
        // Postgres' jsonb cannot hold U+0000; refuse it here with a clear
        // error rather than fail the transaction later.
        if contains_escaped_nul(body) {
            return Err(EventError::NulCharacter);
        }
        let wire: Wire = serde_json::from_slice(body).map_err(|e| EventError::NotJson(e.to_string()))?;
        let id = required_string(wire.id, "id", EventError::MissingId)?;
        let event_type = required_string(wire.event_type, "type", EventError::MissingType)?;
        let payment_id = wire
            .data
            .as_ref()
            .and_then(|d| d.get("payment_id"))
            .and_then(|p| p.as_str())
            .filter(|p| !p.is_empty())
            .map(str::to_owned);
        Ok(Self {
            kind: EventKind::from_type(&event_type),
            id,
            event_type,
            payment_id,
        })
    }
}

fn required_string(
    value: Option<serde_json::Value>,
    field: &'static str,
    missing: EventError,
) -> Result<String, EventError> {
    let Some(serde_json::Value::String(s)) = value else {
        return Err(missing);
    };
    if s.is_empty() {
        return Err(EventError::Empty { field });
    }
    if s.len() > MAX_ID_LEN {
        return Err(EventError::TooLong { field });
    }
    Ok(s)
}

/// True if the JSON text contains the escape `\u0000` (in any hex case). A raw
/// NUL byte is already invalid JSON.
fn contains_escaped_nul(body: &[u8]) -> bool {
    body.windows(6).enumerate().any(|(i, w)| {
        w[0] == b'\\'
            && (w[1] == b'u' || w[1] == b'U')
            && &w[2..] == b"0000"
            && preceding_backslashes(&body[..i]).is_multiple_of(2)
    })
}

fn preceding_backslashes(before: &[u8]) -> usize {
    before.iter().rev().take_while(|&&b| b == b'\\').count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_spec_example() {
        let body = br#"{"id": "evt_1", "type": "payment.succeeded", "created": 1700000000,
            "data": {"payment_id": "pay_1", "amount": 4200, "currency": "gbp"}, "extra": [1]}"#;
        let event = ProviderEvent::parse(body).unwrap();
        assert_eq!(event.id, "evt_1");
        assert_eq!(event.event_type, "payment.succeeded");
        assert_eq!(event.kind, EventKind::PaymentSucceeded);
        assert_eq!(event.payment_id.as_deref(), Some("pay_1"));
    }

    #[test]
    fn kinds() {
        assert_eq!(
            EventKind::from_type("payment.refunded"),
            EventKind::PaymentRefunded
        );
        assert_eq!(
            EventKind::from_type("payment.succeeded"),
            EventKind::PaymentSucceeded
        );
        assert_eq!(EventKind::from_type("Payment.Succeeded"), EventKind::Other);
        assert_eq!(EventKind::from_type("customer.created"), EventKind::Other);
    }

    #[test]
    fn rejects_what_is_not_an_event() {
        let cases: &[(&[u8], EventError)] = &[
            (br#"{"type": "payment.succeeded"}"#, EventError::MissingId),
            (
                br#"{"id": 42, "type": "payment.succeeded"}"#,
                EventError::MissingId,
            ),
            (br#"{"id": "evt_1"}"#, EventError::MissingType),
            (br#"{"id": "evt_1", "type": null}"#, EventError::MissingType),
            (br#"{"id": "", "type": "x"}"#, EventError::Empty { field: "id" }),
            (br#"{"id": "e", "type": ""}"#, EventError::Empty { field: "type" }),
            (br#"{"id": "a\u0000b", "type": "x"}"#, EventError::NulCharacter),
            (
                br#"{"id": "e", "type": "x", "data": {"k": "\U0000"}}"#,
                EventError::NulCharacter,
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(
                ProviderEvent::parse(body).unwrap_err(),
                *expected,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        for body in [
            &b"not json"[..],
            b"[1,2]",
            b"\"evt\"",
            b"",
            b"{\"id\":\"e\",",
            b"\xff\xfe",
        ] {
            assert!(matches!(ProviderEvent::parse(body), Err(EventError::NotJson(_))));
        }
    }

    #[test]
    fn an_escaped_backslash_before_u0000_is_not_a_nul() {
        let body = br#"{"id": "evt_1", "type": "x", "data": {"path": "c:\\u0000"}}"#;
        assert!(ProviderEvent::parse(body).is_ok());
    }

    #[test]
    fn ids_are_bounded() {
        let long = "e".repeat(MAX_ID_LEN + 1);
        let body = format!(r#"{{"id": "{long}", "type": "payment.succeeded"}}"#);
        assert_eq!(
            ProviderEvent::parse(body.as_bytes()).unwrap_err(),
            EventError::TooLong { field: "id" }
        );
        let ok = "e".repeat(MAX_ID_LEN);
        let body = format!(r#"{{"id": "{ok}", "type": "payment.succeeded"}}"#);
        assert_eq!(ProviderEvent::parse(body.as_bytes()).unwrap().id, ok);
    }

    #[test]
    fn payment_id_is_optional_and_must_be_a_non_empty_string() {
        for data in [
            r#"null"#,
            r#""x""#,
            r#"{"payment_id": 7}"#,
            r#"{"payment_id": ""}"#,
            r#"{}"#,
        ] {
            let body = format!(r#"{{"id": "e", "type": "payment.succeeded", "data": {data}}}"#);
            assert_eq!(
                ProviderEvent::parse(body.as_bytes()).unwrap().payment_id,
                None,
                "{data}"
            );
        }
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = ProviderEvent::parse(&body);
        }

        #[test]
        fn round_trips_any_reasonable_id(id in "[ -~]{1,255}", ty in "[a-z.]{1,40}") {
            let body = serde_json::json!({"id": id, "type": ty, "data": {"payment_id": "pay_1"}});
            // An id spelling out `\u0000` is escaped by the encoder, so it is no NUL.
            let parsed = ProviderEvent::parse(body.to_string().as_bytes()).unwrap();
            prop_assert_eq!(parsed.id, id);
            prop_assert_eq!(parsed.event_type, ty);
        }
    }
}
