//! Text from the database (event ids and types, `last_error`, kinds, keys)
//! on its way to an operator's terminal: whoever could write it (a webhook's
//! sender, a downstream's error body) must not be able to clear the screen,
//! move the cursor, rewrite earlier lines or reorder what is shown. And the
//! ages and windows the operator's tables print.

use std::borrow::Cow;

/// `s` with every control character (C0, DEL, C1) and every bidirectional
/// formatting character written as `\u{..}`, and a backslash doubled so the
/// escape cannot be forged. Text without any is returned as is.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else if needs_escape(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A window as it was given: `1h`, not `60m`; `90m`, not `1h`.
pub fn window(seconds: u64) -> String {
    match seconds {
        s if s > 0 && s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s > 0 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s > 0 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// An age, rounded down to a unit that reads at a glance.
pub fn age(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

fn needs_escape(c: char) -> bool {
    c == '\\'
        || c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// A time as the operators' tables show it: UTC, to the millisecond
/// (`2026-12-03T10:21:17.123Z`, 24 characters).
pub fn utc_millis(at: time::OffsetDateTime) -> String {
    at.to_offset(time::UtcOffset::UTC)
        .format(time::macros::format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
        ))
        .unwrap_or_default()
}

/// A stored `traceparent` as the operators' tables show it: the trace id to
/// search for, then the whole context (`-` when there is none, or it is not
/// one).
pub fn shown_trace(traceparent: Option<&str>) -> String {
    match traceparent.and_then(|t| Some((crate::traces::parse_traceparent(t)?.0, t))) {
        Some((trace_id, traceparent)) => format!("{trace_id} (traceparent {})", printable(traceparent)),
        None => "-".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{age, printable, window};

    #[test]
    fn ages() {
        assert_eq!(age(5.2), "5s");
        assert_eq!(age(600.0), "10m");
        assert_eq!(age(3.0 * 3600.0), "3h");
        assert_eq!(age(3.0 * 86_400.0), "3d");
        assert_eq!(age(-1.0), "0s");
    }

    #[test]
    fn windows_read_as_given() {
        assert_eq!(window(3600), "1h");
        assert_eq!(window(5400), "90m");
        assert_eq!(window(86_400), "1d");
        assert_eq!(window(45), "45s");
    }

    #[test]
    fn plain_text_is_unchanged() {
        assert_eq!(
            printable("evt_1 payment_intent.succeeded"),
            "evt_1 payment_intent.succeeded"
        );
        assert!(matches!(printable("évènement"), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn controls_and_bidi_are_escaped() {
        assert_eq!(printable("a\x1b[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(printable("x\ry\n"), "x\\u{d}y\\u{a}");
        assert_eq!(printable("\u{9b}31m"), "\\u{9b}31m");
        assert_eq!(printable("\u{7f}"), "\\u{7f}");
        assert_eq!(printable("ab\u{202e}cd\u{2066}"), "ab\\u{202e}cd\\u{2066}");
        assert_eq!(printable("a\\u{1b}\x1b"), "a\\\\u{1b}\\u{1b}");
    }
}
