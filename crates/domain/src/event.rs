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
    #[error("event contains a lone UTF-16 surrogate escape (\\u{0}), which cannot be stored")]
    LoneSurrogate(String),
    #[error(
        "event contains the number `{0}`, beyond what can be stored (at most 131072 digits before the point and 16383 after)"
    )]
    NumberOutOfRange(String),
    #[error("event nests arrays and objects more than {MAX_DEPTH} deep")]
    TooDeep,
}

/// How deep arrays and objects may nest in an event (as serde_json's own
/// limit for what it parses): Postgres' jsonb parser recurses, and an event
/// nested some thousands deep exhausts its stack.
pub const MAX_DEPTH: usize = 128;

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
        let wire: Wire = serde_json::from_slice(body).map_err(|e| EventError::NotJson(e.to_string()))?;
        // What Postgres' jsonb cannot hold, anywhere in the event (fields
        // this parser skips included): refused here with a clear 400 rather
        // than failing the transaction later (a 500 the provider would retry
        // for days).
        storable(body)?;
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

/// Whether Postgres' jsonb can hold `body`, valid JSON: no `\u0000`, no
/// lone surrogate escape, every number within `numeric`'s range, nesting at
/// most [`MAX_DEPTH`]. One pass over the bytes.
fn storable(body: &[u8]) -> Result<(), EventError> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < body.len() {
        match body[i] {
            b'"' => i = string_end(body, i + 1)?,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(EventError::TooDeep);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'-' | b'0'..=b'9' => {
                let len = body[i..]
                    .iter()
                    .take_while(|b| matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))
                    .count();
                let number = &body[i..i + len];
                if !number_fits(number) {
                    let shown = String::from_utf8_lossy(&number[..number.len().min(40)]).into_owned();
                    return Err(EventError::NumberOutOfRange(shown));
                }
                i += len - 1;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// The index of the quote closing the string that starts at `i`, its escapes
/// checked.
fn string_end(body: &[u8], mut i: usize) -> Result<usize, EventError> {
    while i < body.len() {
        match body[i] {
            b'"' => return Ok(i),
            b'\\' if body.get(i + 1) == Some(&b'u') => {
                let unit = hex4(body, i + 2);
                match unit {
                    Some(0) => return Err(EventError::NulCharacter),
                    Some(0xD800..=0xDBFF) => {
                        let low = (body.get(i + 6) == Some(&b'\\') && body.get(i + 7) == Some(&b'u'))
                            .then(|| hex4(body, i + 8))
                            .flatten();
                        if !matches!(low, Some(0xDC00..=0xDFFF)) {
                            return Err(lone(body, i));
                        }
                        i += 12;
                        continue;
                    }
                    Some(0xDC00..=0xDFFF) => return Err(lone(body, i)),
                    _ => i += 6,
                }
                continue;
            }
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    Ok(i)
}

fn hex4(body: &[u8], at: usize) -> Option<u32> {
    let digits = std::str::from_utf8(body.get(at..at + 4)?).ok()?;
    u32::from_str_radix(digits, 16).ok()
}

fn lone(body: &[u8], at: usize) -> EventError {
    EventError::LoneSurrogate(String::from_utf8_lossy(&body[at + 2..(at + 6).min(body.len())]).into_owned())
}

/// Whether a JSON number fits Postgres' `numeric` (as jsonb stores it): at
/// most 16383 digits after the point (as written, less the exponent), a
/// first significant digit at most 131071 places before it, an exponent
/// below 2^30.
fn number_fits(number: &[u8]) -> bool {
    let text = number.strip_prefix(b"-").unwrap_or(number);
    let (mantissa, exponent) = match text.iter().position(|b| matches!(b, b'e' | b'E')) {
        Some(e) => (&text[..e], &text[e + 1..]),
        None => (text, &b""[..]),
    };
    let exponent: i64 = if exponent.is_empty() {
        0
    } else {
        let (negative, digits) = match exponent.first() {
            Some(b'-') => (true, &exponent[1..]),
            Some(b'+') => (false, &exponent[1..]),
            _ => (false, exponent),
        };
        let magnitude = digits
            .iter()
            .try_fold(0i64, |n, d| n.checked_mul(10)?.checked_add(i64::from(d - b'0')))
            .unwrap_or(i64::MAX);
        if magnitude >= (1 << 30) {
            return false;
        }
        if negative { -magnitude } else { magnitude }
    };
    let (int, frac) = match mantissa.iter().position(|&b| b == b'.') {
        Some(p) => (&mantissa[..p], &mantissa[p + 1..]),
        None => (mantissa, &b""[..]),
    };
    let scale = (frac.len() as i64 - exponent).max(0);
    if scale > 16383 {
        return false;
    }
    // The first significant digit's place: 0 for units, -1 for tenths.
    let first = match int.iter().position(|&b| b != b'0') {
        Some(p) => Some((int.len() - p) as i64 - 1),
        None => frac.iter().position(|&b| b != b'0').map(|p| -(p as i64) - 1),
    };
    first.is_none_or(|place| place + exponent < 131_072)
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
                br#"{"id": "e", "type": "x", "data": {"k": "\u0000"}}"#,
                EventError::NulCharacter,
            ),
            // Anywhere, in fields the parser skips too: what jsonb refuses.
            (
                br#"{"id": "e", "type": "x", "z": "\ud800"}"#,
                EventError::LoneSurrogate("d800".into()),
            ),
            (
                br#"{"id": "e", "type": "x", "z": ["\uDC00\ud83d\ude00"]}"#,
                EventError::LoneSurrogate("DC00".into()),
            ),
            (
                br#"{"id": "e", "type": "x", "z": "\ud83d\u0041"}"#,
                EventError::LoneSurrogate("d83d".into()),
            ),
            (
                br#"{"id": "e", "type": "x", "z": 1e200000}"#,
                EventError::NumberOutOfRange("1e200000".into()),
            ),
            (
                br#"{"id": "e", "type": "x", "z": [0e-16384]}"#,
                EventError::NumberOutOfRange("0e-16384".into()),
            ),
            (
                br#"{"id": "e", "type": "x", "z": {"a": -1E+131072}}"#,
                EventError::NumberOutOfRange("-1E+131072".into()),
            ),
            (
                br#"{"id": "e", "type": "x", "z": 0e99999999999}"#,
                EventError::NumberOutOfRange("0e99999999999".into()),
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
