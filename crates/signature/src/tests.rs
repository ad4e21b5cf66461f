//! The verifier's unit tests: every failure, both schemes, the tolerance.

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
    // Base64 that decodes, but no prefix: refused, not decoded into a key
    // that then fails every signature.
    assert_eq!(
        Verifier::new(Scheme::Standard, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwabcd", 300).unwrap_err(),
        SecretError::NoPrefix(1)
    );
    assert_eq!(
        Verifier::new(Scheme::Standard, "short", 300)
            .unwrap_err()
            .to_string(),
        "secret #1 does not start with `whsec_`: under the standard scheme a secret is `whsec_` and base64, \
         as the provider shows it (WEBHOOK_SIGNATURE_SCHEME=stripe uses a secret as it is)"
    );
    assert_eq!(
        Verifier::with_min_key_bytes(Scheme::Standard, "whsec_QUJD", 300, 16).unwrap_err(),
        SecretError::KeyTooShort { position: 1, min: 16 }
    );
    assert_eq!(
        Verifier::with_min_key_bytes(Scheme::Stripe, "short", 300, 16)
            .unwrap_err()
            .to_string(),
        "secret #1 is shorter than 16 bytes (the stripe scheme uses it as it is)"
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
