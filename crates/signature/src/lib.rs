//! Webhook signature verification (and signing, for simulators and tests).
//!
//! Two schemes, both HMAC-SHA256 over the raw body bytes:
//! - [`Scheme::Standard`] ([Standard Webhooks](https://www.standardwebhooks.com)):
//!   headers `webhook-id`, `webhook-timestamp`, `webhook-signature` (space
//!   separated `v1,<base64>` entries), signed content `{id}.{timestamp}.{body}`,
//!   keyed with the base64-decoded part of a `whsec_...` secret.
//! - [`Scheme::Stripe`]: header `Stripe-Signature: t=<ts>,v1=<hex>[,v1=...]`,
//!   signed content `{t}.{body}`, keyed with the secret string's bytes.
//!
//! Several secrets may be active at once (rotation); any one may match any
//! signature entry. Tags are compared in constant time. Timestamps further
//! than the tolerance in the past *or* the future are rejected in both schemes,
//! which bounds how long a captured request can be replayed.
//!
//! Nothing here allocates per secret on the hot path: each secret's keyed HMAC
//! state is computed once at start-up and cloned per request.
#![forbid(unsafe_code)]

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::Sha256;
use subtle::ConstantTimeEq;

type HmacSha256 = Hmac<Sha256>;

/// Default tolerance, as the Standard Webhooks libraries use: long enough for
/// clock skew and a provider's queueing, short enough to bound replays.
pub const DEFAULT_TOLERANCE_SECS: u64 = 300;

pub const HEADER_ID: &str = "webhook-id";
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
pub const HEADER_SIGNATURE: &str = "webhook-signature";
pub const HEADER_STRIPE: &str = "stripe-signature";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Standard,
    Stripe,
}

impl Scheme {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "standard" => Some(Self::Standard),
            "stripe" => Some(Self::Stripe),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Standard => "standard",
            Self::Stripe => "stripe",
        }
    }
}

/// Why a configured secret list is unusable. Never contains the secret.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("no secret given")]
    Empty,
    #[error("secret #{0} is empty")]
    EmptyEntry(usize),
    #[error("secret #{0} is not valid base64 after its `whsec_` prefix (standard scheme)")]
    NotBase64(usize),
}

/// Why a request is rejected. Every variant is a 401; the text is safe to
/// return to the caller and to log (it never includes secrets or tags).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    #[error("malformed header {0}")]
    MalformedHeader(&'static str),
    #[error("timestamp outside the tolerance")]
    TimestampOutOfTolerance,
    #[error("no signature matches")]
    NoMatchingSignature,
}

/// One secret's keyed HMAC state. Its `Debug` never shows the key.
#[derive(Clone)]
pub struct Secret(HmacSha256);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    fn from_key(key: &[u8]) -> Self {
        Self(HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length"))
    }

    /// A secret as configured for `scheme`.
    pub fn parse(scheme: Scheme, text: &str) -> Result<Self, SecretError> {
        Self::parse_entry(scheme, text, 1)
    }

    fn parse_entry(scheme: Scheme, text: &str, position: usize) -> Result<Self, SecretError> {
        if text.is_empty() {
            return Err(SecretError::EmptyEntry(position));
        }
        match scheme {
            Scheme::Standard => {
                let encoded = text.strip_prefix("whsec_").unwrap_or(text);
                let key = B64
                    .decode(encoded)
                    .map_err(|_| SecretError::NotBase64(position))?;
                if key.is_empty() {
                    return Err(SecretError::EmptyEntry(position));
                }
                Ok(Self::from_key(&key))
            }
            Scheme::Stripe => Ok(Self::from_key(text.as_bytes())),
        }
    }

    fn tag(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut mac = self.0.clone();
        for part in parts {
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }
}

/// Verifies requests against a scheme, a set of secrets and a tolerance.
#[derive(Debug, Clone)]
pub struct Verifier {
    scheme: Scheme,
    secrets: Vec<Secret>,
    tolerance_secs: u64,
}

impl Verifier {
    /// `secrets` is the comma-separated list from configuration.
    pub fn new(scheme: Scheme, secrets: &str, tolerance_secs: u64) -> Result<Self, SecretError> {
        if secrets.trim().is_empty() {
            return Err(SecretError::Empty);
        }
        let secrets = secrets
            .split(',')
            .enumerate()
            .map(|(i, s)| Secret::parse_entry(scheme, s.trim(), i + 1))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            scheme,
            secrets,
            tolerance_secs,
        })
    }

    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// Verifies `body` with the request's headers (looked up by lower-case
    /// name) at the time `now` (Unix seconds).
    pub fn verify<'h>(
        &self,
        header: impl Fn(&'static str) -> Option<&'h [u8]>,
        body: &[u8],
        now: i64,
    ) -> Result<(), VerifyError> {
        match self.scheme {
            Scheme::Standard => self.verify_standard(header, body, now),
            Scheme::Stripe => self.verify_stripe(header, body, now),
        }
    }

    fn verify_standard<'h>(
        &self,
        header: impl Fn(&'static str) -> Option<&'h [u8]>,
        body: &[u8],
        now: i64,
    ) -> Result<(), VerifyError> {
        let id = required(&header, HEADER_ID)?;
        let timestamp = required(&header, HEADER_TIMESTAMP)?;
        let signatures = required(&header, HEADER_SIGNATURE)?;
        let ts = parse_timestamp(timestamp, HEADER_TIMESTAMP)?;
        self.check_tolerance(ts, now)?;
        let candidates: Vec<Vec<u8>> = signatures
            .split(' ')
            .filter_map(|entry| entry.strip_prefix("v1,"))
            .filter_map(|b64| B64.decode(b64).ok())
            .collect();
        self.match_any(
            &[id.as_bytes(), b".", timestamp.as_bytes(), b".", body],
            &candidates,
        )
    }

    fn verify_stripe<'h>(
        &self,
        header: impl Fn(&'static str) -> Option<&'h [u8]>,
        body: &[u8],
        now: i64,
    ) -> Result<(), VerifyError> {
        let value = required(&header, HEADER_STRIPE)?;
        let mut timestamp = None;
        let mut candidates = Vec::new();
        for item in value.split(',') {
            match item.trim().split_once('=') {
                Some(("t", t)) if timestamp.is_none() => timestamp = Some(t),
                Some(("v1", tag)) => candidates.extend(hex::decode(tag).ok()),
                _ => {}
            }
        }
        let timestamp = timestamp.ok_or(VerifyError::MalformedHeader(HEADER_STRIPE))?;
        let ts = parse_timestamp(timestamp, HEADER_STRIPE)?;
        self.check_tolerance(ts, now)?;
        self.match_any(&[timestamp.as_bytes(), b".", body], &candidates)
    }

    fn check_tolerance(&self, ts: i64, now: i64) -> Result<(), VerifyError> {
        if now.abs_diff(ts) > self.tolerance_secs {
            return Err(VerifyError::TimestampOutOfTolerance);
        }
        Ok(())
    }

    /// Every secret's tag against every candidate, without an early exit
    /// whose timing depends on secret data.
    fn match_any(&self, signed: &[&[u8]], candidates: &[Vec<u8>]) -> Result<(), VerifyError> {
        if candidates.is_empty() {
            return Err(VerifyError::NoMatchingSignature);
        }
        let mut matched = subtle::Choice::from(0);
        for secret in &self.secrets {
            let tag = secret.tag(signed);
            for candidate in candidates {
                matched |= tag.as_slice().ct_eq(candidate.as_slice());
            }
        }
        if bool::from(matched) {
            Ok(())
        } else {
            Err(VerifyError::NoMatchingSignature)
        }
    }
}

fn required<'h>(
    header: &impl Fn(&'static str) -> Option<&'h [u8]>,
    name: &'static str,
) -> Result<&'h str, VerifyError> {
    let raw = header(name).ok_or(VerifyError::MissingHeader(name))?;
    let text = std::str::from_utf8(raw).map_err(|_| VerifyError::MalformedHeader(name))?;
    if text.trim().is_empty() {
        return Err(VerifyError::MissingHeader(name));
    }
    Ok(text)
}

fn parse_timestamp(text: &str, header: &'static str) -> Result<i64, VerifyError> {
    if text.is_empty() || text.len() > 12 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(VerifyError::MalformedHeader(header));
    }
    text.parse().map_err(|_| VerifyError::MalformedHeader(header))
}

/// The `webhook-signature` value a Standard Webhooks sender would send.
pub fn sign_standard(secret: &Secret, id: &str, timestamp: i64, body: &[u8]) -> String {
    let ts = timestamp.to_string();
    let tag = secret.tag(&[id.as_bytes(), b".", ts.as_bytes(), b".", body]);
    format!("v1,{}", B64.encode(tag))
}

/// The `Stripe-Signature` value a Stripe-style sender would send.
pub fn sign_stripe(secret: &Secret, timestamp: i64, body: &[u8]) -> String {
    let ts = timestamp.to_string();
    let tag = secret.tag(&[ts.as_bytes(), b".", body]);
    format!("t={ts},v1={}", hex::encode(tag))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const STD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const NOW: i64 = 1_700_000_000;

    fn headers(pairs: &[(&'static str, String)]) -> HashMap<&'static str, Vec<u8>> {
        pairs.iter().map(|(k, v)| (*k, v.clone().into_bytes())).collect()
    }

    fn verify(
        v: &Verifier,
        h: &HashMap<&'static str, Vec<u8>>,
        body: &[u8],
        now: i64,
    ) -> Result<(), VerifyError> {
        v.verify(|name| h.get(name).map(Vec::as_slice), body, now)
    }

    fn standard_request(secret: &str, id: &str, ts: i64, body: &[u8]) -> HashMap<&'static str, Vec<u8>> {
        let s = Secret::parse(Scheme::Standard, secret).unwrap();
        headers(&[
            (HEADER_ID, id.into()),
            (HEADER_TIMESTAMP, ts.to_string()),
            (HEADER_SIGNATURE, sign_standard(&s, id, ts, body)),
        ])
    }

    /// The provider's published signature vectors, kept in
    /// `tests/signatures.json`.
    #[test]
    fn published_vectors() {
        let copy = include_str!("../tests/signatures.json");
        let text = copy;
        let vectors: serde_json::Value = serde_json::from_str(text).unwrap();
        let mut checked = 0;
        for v in vectors["standard"].as_array().unwrap() {
            let verifier = Verifier::new(Scheme::Standard, v["secret"].as_str().unwrap(), 300).unwrap();
            let ts: i64 = v["webhook_timestamp"].as_str().unwrap().parse().unwrap();
            let h = headers(&[
                (HEADER_ID, v["webhook_id"].as_str().unwrap().into()),
                (HEADER_TIMESTAMP, v["webhook_timestamp"].as_str().unwrap().into()),
                (HEADER_SIGNATURE, v["signature"].as_str().unwrap().into()),
            ]);
            let result = verify(&verifier, &h, v["payload"].as_str().unwrap().as_bytes(), ts);
            assert_eq!(result.is_ok(), v["valid"].as_bool().unwrap(), "{v}");
            checked += 1;
        }
        for v in vectors["stripe"].as_array().unwrap() {
            let verifier = Verifier::new(Scheme::Stripe, v["secret"].as_str().unwrap(), 300).unwrap();
            let ts: i64 = v["t"].as_str().unwrap().parse().unwrap();
            let h = headers(&[(HEADER_STRIPE, v["header"].as_str().unwrap().into())]);
            let result = verify(&verifier, &h, v["payload"].as_str().unwrap().as_bytes(), ts);
            assert_eq!(result.is_ok(), v["valid"].as_bool().unwrap(), "{v}");
            checked += 1;
        }
        assert!(checked >= 5, "the vectors file lost entries: {checked}");
    }

    #[test]
    fn standard_round_trip_and_failures() {
        let v = Verifier::new(Scheme::Standard, STD_SECRET, 300).unwrap();
        let body = br#"{"id":"evt_1"}"#;
        let good = standard_request(STD_SECRET, "msg_1", NOW, body);
        assert_eq!(verify(&v, &good, body, NOW), Ok(()));
        assert_eq!(verify(&v, &good, body, NOW + 300), Ok(()));
        assert_eq!(verify(&v, &good, body, NOW - 300), Ok(()));
        assert_eq!(
            verify(&v, &good, body, NOW + 301),
            Err(VerifyError::TimestampOutOfTolerance)
        );
        assert_eq!(
            verify(&v, &good, body, NOW - 301),
            Err(VerifyError::TimestampOutOfTolerance)
        );
        assert_eq!(
            verify(&v, &good, br#"{"id":"evt_2"}"#, NOW),
            Err(VerifyError::NoMatchingSignature)
        );

        let other = standard_request("whsec_QUJDREVGR0hJSktMTU5PUA==", "msg_1", NOW, body);
        assert_eq!(
            verify(&v, &other, body, NOW),
            Err(VerifyError::NoMatchingSignature)
        );

        for missing in [HEADER_ID, HEADER_TIMESTAMP, HEADER_SIGNATURE] {
            let mut h = good.clone();
            h.remove(missing);
            assert_eq!(
                verify(&v, &h, body, NOW),
                Err(VerifyError::MissingHeader(missing))
            );
        }
        for bad_ts in ["", "abc", "-5", "1.5", "99999999999999999999", " 1700000000"] {
            let mut h = good.clone();
            h.insert(HEADER_TIMESTAMP, bad_ts.as_bytes().to_vec());
            assert!(verify(&v, &h, body, NOW).is_err(), "{bad_ts:?}");
        }
        let mut h = good.clone();
        h.insert(HEADER_SIGNATURE, b"v1,not-base64!! v2,abc".to_vec());
        assert_eq!(verify(&v, &h, body, NOW), Err(VerifyError::NoMatchingSignature));
        h.insert(HEADER_SIGNATURE, vec![0xff, 0xfe]);
        assert_eq!(
            verify(&v, &h, body, NOW),
            Err(VerifyError::MalformedHeader(HEADER_SIGNATURE))
        );
    }

    #[test]
    fn the_id_is_signed_content() {
        let v = Verifier::new(Scheme::Standard, STD_SECRET, 300).unwrap();
        let body = b"{}";
        let mut h = standard_request(STD_SECRET, "msg_1", NOW, body);
        h.insert(HEADER_ID, b"msg_2".to_vec());
        assert_eq!(verify(&v, &h, body, NOW), Err(VerifyError::NoMatchingSignature));
    }

    #[test]
    fn rotation_any_secret_any_entry() {
        let old = "whsec_QUJDREVGR0hJSktMTU5PUA==";
        let v = Verifier::new(Scheme::Standard, &format!("{STD_SECRET}, {old}"), 300).unwrap();
        let body = b"{}";
        assert_eq!(
            verify(&v, &standard_request(old, "m", NOW, body), body, NOW),
            Ok(())
        );
        assert_eq!(
            verify(&v, &standard_request(STD_SECRET, "m", NOW, body), body, NOW),
            Ok(())
        );
        // A sender signing with two secrets sends two entries; either may match.
        let mut h = standard_request("whsec_WFlaWFlaWFlaWFlaWFlaWA==", "m", NOW, body);
        let good = standard_request(old, "m", NOW, body);
        let both = format!(
            "{} {}",
            String::from_utf8(h[HEADER_SIGNATURE].clone()).unwrap(),
            String::from_utf8(good[HEADER_SIGNATURE].clone()).unwrap()
        );
        h.insert(HEADER_SIGNATURE, both.into_bytes());
        assert_eq!(verify(&v, &h, body, NOW), Ok(()));
    }

    #[test]
    fn stripe_round_trip_and_failures() {
        let secret = "whsec_test_secret";
        let v = Verifier::new(Scheme::Stripe, secret, 300).unwrap();
        let s = Secret::parse(Scheme::Stripe, secret).unwrap();
        let body = br#"{"id":"evt_1"}"#;
        let good = headers(&[(HEADER_STRIPE, sign_stripe(&s, NOW, body))]);
        assert_eq!(verify(&v, &good, body, NOW), Ok(()));
        assert_eq!(
            verify(&v, &good, body, NOW + 301),
            Err(VerifyError::TimestampOutOfTolerance)
        );
        assert_eq!(
            verify(&v, &good, body, NOW - 301),
            Err(VerifyError::TimestampOutOfTolerance)
        );
        assert_eq!(
            verify(&v, &good, b"{}", NOW),
            Err(VerifyError::NoMatchingSignature)
        );
        for bad in ["", "v1=abcd", "t=,v1=00", "t=x,v1=00", "garbage"] {
            let h = headers(&[(HEADER_STRIPE, bad.into())]);
            assert!(verify(&v, &h, body, NOW).is_err(), "{bad:?}");
        }
        // Decoys beside the real tag, in any order, and a v0 entry, are fine.
        let real = sign_stripe(&s, NOW, body);
        let tag = real.split_once(",v1=").unwrap().1;
        let h = headers(&[(
            HEADER_STRIPE,
            format!("t={NOW},v0=dead,v1=zz,v1={}, v1={tag}", "00".repeat(32)),
        )]);
        assert_eq!(verify(&v, &h, body, NOW), Ok(()));
        let none = Verifier::new(Scheme::Stripe, "other", 300).unwrap();
        assert_eq!(
            verify(&none, &good, body, NOW),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn secrets_are_validated_and_never_shown() {
        assert_eq!(
            Verifier::new(Scheme::Standard, " ", 300).unwrap_err(),
            SecretError::Empty
        );
        assert_eq!(
            Verifier::new(Scheme::Standard, "whsec_!!!", 300).unwrap_err(),
            SecretError::NotBase64(1)
        );
        assert_eq!(
            Verifier::new(Scheme::Standard, &format!("{STD_SECRET},,"), 300).unwrap_err(),
            SecretError::EmptyEntry(2)
        );
        assert!(Verifier::new(Scheme::Stripe, "anything goes", 300).is_ok());
        let v = Verifier::new(Scheme::Standard, STD_SECRET, 300).unwrap();
        let shown = format!("{v:?}");
        assert!(!shown.contains("MfKQ9r8G"), "{shown}");
        assert!(shown.contains("redacted"));
    }

    proptest! {
        /// Any single-byte change of body, id, timestamp or signature fails.
        #[test]
        fn any_single_byte_change_is_rejected(
            body in proptest::collection::vec(any::<u8>(), 1..256),
            which in 0usize..4,
            pos in any::<prop::sample::Index>(),
            delta in 1u8..=255,
        ) {
            let v = Verifier::new(Scheme::Standard, STD_SECRET, 300).unwrap();
            let mut h = standard_request(STD_SECRET, "msg_abc", NOW, &body);
            let mut body = body;
            match which {
                0 => { let i = pos.index(body.len()); body[i] = body[i].wrapping_add(delta); }
                1 => { let b = h.get_mut(HEADER_ID).unwrap(); let i = pos.index(b.len()); b[i] = b[i].wrapping_add(delta); }
                2 => { let b = h.get_mut(HEADER_TIMESTAMP).unwrap(); let i = pos.index(b.len()); b[i] = b[i].wrapping_add(delta); }
                _ => {
                    // Only the tag: the `v1,` prefix is the scheme's, not signed content.
                    let b = h.get_mut(HEADER_SIGNATURE).unwrap();
                    let i = 3 + pos.index(b.len() - 3);
                    b[i] = b[i].wrapping_add(delta);
                }
            }
            prop_assert!(verify(&v, &h, &body, NOW).is_err());
        }

        #[test]
        fn arbitrary_headers_never_panic(
            id in proptest::collection::vec(any::<u8>(), 0..64),
            ts in proptest::collection::vec(any::<u8>(), 0..24),
            sig in proptest::collection::vec(any::<u8>(), 0..128),
            body in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let v = Verifier::new(Scheme::Standard, STD_SECRET, 300).unwrap();
            let h: HashMap<&'static str, Vec<u8>> =
                [(HEADER_ID, id), (HEADER_TIMESTAMP, ts), (HEADER_SIGNATURE, sig.clone())].into_iter().collect();
            prop_assert!(verify(&v, &h, &body, NOW).is_err());
            let s = Verifier::new(Scheme::Stripe, "s", 300).unwrap();
            let h: HashMap<&'static str, Vec<u8>> = [(HEADER_STRIPE, sig)].into_iter().collect();
            prop_assert!(verify(&s, &h, &body, NOW).is_err());
        }
    }
}
