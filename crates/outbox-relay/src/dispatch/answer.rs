//! Reading a downstream's answer: which statuses a retry may cure, its
//! `Retry-After`, and as much of an error body as a `last_error` keeps, with
//! the call's own credential scrubbed out of it.

use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::HeaderValue;

/// How much of an error body the relay reads (a `last_error` keeps an
/// excerpt of it): a downstream answering with a gigabyte, or an endless
/// stream, does not grow the relay's memory nor hold its call.
pub const ERROR_BODY_LIMIT: usize = 8 * 1024;

/// The body's first `limit` bytes (fewer if it ends or fails first), as text;
/// what follows is not read. Dropping the response mid-body closes its
/// connection rather than draining it.
pub(super) async fn read_capped(mut response: reqwest::Response, limit: usize) -> String {
    let mut kept = Vec::new();
    while kept.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = limit - kept.len();
                kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    drop(response);
    String::from_utf8_lossy(&kept).into_owned()
}

/// `text` without the credential: the whole header value, and its token
/// (what follows the scheme, `Bearer` or `Basic`), each become `[redacted]`.
pub(super) fn scrub(text: &str, authorization: Option<&HeaderValue>) -> String {
    let Some(value) = authorization.and_then(|a| a.to_str().ok()) else {
        return text.to_owned();
    };
    let mut text = text.to_owned();
    let token = value.split_once(' ').map_or(value, |(_, t)| t).trim();
    for secret in [value.trim(), token] {
        if !secret.is_empty() {
            text = text.replace(secret, process::secret::REDACTED);
        }
    }
    text
}

pub fn is_retryable_status(status: StatusCode) -> bool {
    status.is_server_error() || matches!(status.as_u16(), 408 | 409 | 425 | 429)
}

pub(super) fn describe_transport_error(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connection failed"
    } else if e.is_request() || e.is_body() {
        "connection error"
    } else {
        "transport error"
    };
    let mut text = format!("{kind}: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// `Retry-After`: delay-seconds or an HTTP-date.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        for s in [408, 409, 425, 429, 500, 502, 503, 504, 599] {
            assert!(is_retryable_status(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        for s in [400, 401, 403, 404, 405, 410, 413, 422, 451] {
            assert!(!is_retryable_status(StatusCode::from_u16(s).unwrap()), "{s}");
        }
    }

    #[test]
    fn an_echoed_credential_is_scrubbed() {
        let mut value = HeaderValue::from_static("Bearer t0ken-123");
        value.set_sensitive(true);
        assert_eq!(
            scrub("bad token t0ken-123 (Bearer t0ken-123)", Some(&value)),
            "bad token [redacted] ([redacted])"
        );
        assert_eq!(scrub("no such order", Some(&value)), "no such order");
        assert_eq!(scrub("t0ken-123", None), "t0ken-123");
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after("7"), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after(" 0 "), Some(Duration::ZERO));
        let in_a_minute = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(60));
        let d = parse_retry_after(&in_a_minute).unwrap();
        assert!(
            d > Duration::from_secs(55) && d <= Duration::from_secs(60),
            "{d:?}"
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon"), None);
    }
}
