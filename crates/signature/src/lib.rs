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
    #[error(
        "secret #{0} does not start with `whsec_`: under the standard scheme a secret is `whsec_` and base64, \
         as the provider shows it (WEBHOOK_SIGNATURE_SCHEME=stripe uses a secret as it is)"
    )]
    NoPrefix(usize),
    #[error("secret #{0} is not valid base64 after its `whsec_` prefix")]
    NotBase64(usize),
    #[error("secret #{position} decodes to fewer than {min} bytes (the base64 after `whsec_`)")]
    KeyTooShort { position: usize, min: usize },
    #[error("secret #{position} is shorter than {min} bytes (the stripe scheme uses it as it is)")]
    TooShort { position: usize, min: usize },
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
        Self::parse_entry_min(scheme, text, position, 1)
    }

    /// The entry's HMAC key (base64-decoded for the standard scheme, the text
    /// itself for the stripe scheme) must be at least `min` bytes long.
    fn parse_entry_min(scheme: Scheme, text: &str, position: usize, min: usize) -> Result<Self, SecretError> {
        if text.is_empty() {
            return Err(SecretError::EmptyEntry(position));
        }
        let key = match scheme {
            Scheme::Standard => {
                let encoded = text
                    .strip_prefix("whsec_")
                    .ok_or(SecretError::NoPrefix(position))?;
                B64.decode(encoded)
                    .map_err(|_| SecretError::NotBase64(position))?
            }
            Scheme::Stripe => text.as_bytes().to_vec(),
        };
        if key.is_empty() {
            return Err(SecretError::EmptyEntry(position));
        }
        if key.len() < min {
            return Err(match scheme {
                Scheme::Standard => SecretError::KeyTooShort { position, min },
                Scheme::Stripe => SecretError::TooShort { position, min },
            });
        }
        Ok(Self::from_key(&key))
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
        Self::with_min_key_bytes(scheme, secrets, tolerance_secs, 1)
    }

    /// As [`Verifier::new`], refusing any secret whose HMAC key is shorter
    /// than `min_key_bytes` (the ingest's configuration asks for 16; the
    /// verifier itself accepts what the published vectors use).
    pub fn with_min_key_bytes(
        scheme: Scheme,
        secrets: &str,
        tolerance_secs: u64,
        min_key_bytes: usize,
    ) -> Result<Self, SecretError> {
        if secrets.trim().is_empty() {
            return Err(SecretError::Empty);
        }
        let secrets = secrets
            .split(',')
            .enumerate()
            .map(|(i, s)| Secret::parse_entry_min(scheme, s.trim(), i + 1, min_key_bytes))
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
mod tests;
