//! W3C trace context for downstream calls: each call carries a `traceparent`
//! in the trace of the event that caused it (stored on the row by the ingest),
//! with a span id of its own.

use rand::Rng as _;

/// `traceparent` for a call made on behalf of a row whose stored context is
/// `stored`; a fresh trace when the row has none (or an unreadable one).
pub fn child_traceparent(stored: Option<&str>) -> String {
    let mut rng = rand::rng();
    let span_id: u64 = rng.random_range(1..=u64::MAX);
    match stored.and_then(parse) {
        Some((trace_id, flags)) => format!("00-{trace_id}-{span_id:016x}-{flags}"),
        None => {
            let trace_id: u128 = rng.random_range(1..=u128::MAX);
            format!("00-{trace_id:032x}-{span_id:016x}-01")
        }
    }
}

/// The trace id and flags of a version-00 `traceparent`.
pub fn parse(traceparent: &str) -> Option<(&str, &str)> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace_id, span_id, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    if version != "00" || !hex(trace_id, 32) || !hex(span_id, 16) || !hex(flags, 2) {
        return None;
    }
    if trace_id.bytes().all(|b| b == b'0') || span_id.bytes().all(|b| b == b'0') {
        return None;
    }
    Some((trace_id, flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_keep_the_trace() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let child = child_traceparent(Some(parent));
        assert!(child.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert!(child.ends_with("-01"));
        assert_ne!(child, parent);
        assert!(parse(&child).is_some());
    }

    #[test]
    fn missing_or_bad_contexts_start_a_trace() {
        for stored in [
            None,
            Some("garbage"),
            Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
        ] {
            let t = child_traceparent(stored);
            assert!(parse(&t).is_some(), "{t}");
        }
    }
}
