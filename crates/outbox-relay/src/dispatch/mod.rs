//! One downstream call for one row, and what to do about its result.
//!
//! `prepare -> call -> classify`: the row becomes a [`domain::Command`], the
//! command becomes a request (the same key and the same body bytes on every
//! attempt: a downstream rejects a reused key with a different body), and the
//! response becomes a [`CallResult`], which [`crate::policy`] turns into the
//! row's [`Verdict`](crate::storage::Verdict):
//!
//! | answer | call result | verdict |
//! |---|---|---|
//! | 2xx | succeeded | done |
//! | 408, 409, 425, 429, 5xx, timeout, connection error | transient | retry after a backoff (or `Retry-After`) |
//! | any other status | permanent | dead at once: retrying cannot help |
//! | a transient failure of the `RELAY_MAX_ATTEMPTS`th call | transient | dead, keeping the last error |
//!
//! A non-2xx body is read up to [`ERROR_BODY_LIMIT`] bytes and no further
//! (a 2xx body is not read at all).
//!
//! A [`CallResult`] carries the HTTP status it got (none for a timeout, a
//! connection error, or a row never sent), for the relay's one log line per
//! call.

use std::time::Duration;

use domain::{Command, CommandKind, Endpoint};
use reqwest::header::{AUTHORIZATION, HeaderValue};
use tracing::Instrument as _;
use tracing::field::Empty;

use crate::downstream::Downstream;
use crate::storage::{ClaimedRow, RowKind};

mod answer;

pub use answer::{ERROR_BODY_LIMIT, is_retryable_status, parse_retry_after};
use answer::{describe_transport_error, read_capped, scrub};

/// Where the commands go: the full URLs (no user or password in them), and
/// each endpoint's `Authorization` header, marked sensitive.
#[derive(Debug, Clone)]
pub struct Endpoints {
    shipments: Target,
    emails: Target,
}

/// One endpoint: its URL and the `Authorization` its calls carry.
#[derive(Debug, Clone)]
struct Target {
    url: reqwest::Url,
    authorization: Option<HeaderValue>,
}

impl Target {
    fn new(downstream: &Downstream, path: &str, variable: &str) -> Result<Self, String> {
        // No URL in the message: a bad base never gets this far (the
        // configuration checks it), and one could hold a password.
        let base = downstream.base_url.as_str().trim_end_matches('/');
        let url = reqwest::Url::parse(&format!("{base}{path}"))
            .map_err(|e| format!("{variable}_URL with {path}: {e}"))?;
        let authorization = downstream
            .authorization
            .as_ref()
            .map(|value| {
                let mut header = HeaderValue::from_str(value.expose())
                    .map_err(|_| format!("{variable}_AUTHORIZATION is not a valid header value"))?;
                // Never shown by `Debug` (of a request, a header map).
                header.set_sensitive(true);
                Ok::<_, String>(header)
            })
            .transpose()?;
        Ok(Self { url, authorization })
    }
}

impl Endpoints {
    /// From the configured downstreams (`FULFILMENT_URL` and
    /// `FULFILMENT_AUTHORIZATION`, `EMAIL_URL` and `EMAIL_AUTHORIZATION`).
    pub fn new(fulfilment: &Downstream, email: &Downstream) -> Result<Self, String> {
        Ok(Self {
            shipments: Target::new(fulfilment, CommandKind::ShipOrder.path(), "FULFILMENT")?,
            emails: Target::new(email, CommandKind::SendConfirmation.path(), "EMAIL")?,
        })
    }

    fn target(&self, kind: CommandKind) -> &Target {
        match kind.endpoint() {
            Endpoint::Fulfilment => &self.shipments,
            Endpoint::Email => &self.emails,
        }
    }
}

/// What an attempt at a downstream call produced, before any policy: the
/// answer classified, and the HTTP status when there was one.
#[derive(Debug, Clone, PartialEq)]
pub enum CallResult {
    /// A 2xx answer.
    Succeeded { http_status: u16 },
    /// A failure that may pass: a retryable status, a timeout, a connection
    /// error, a payload only a newer relay can read. `retry_after` is the
    /// server's `Retry-After`, if it gave one.
    Transient {
        http_status: Option<u16>,
        retry_after: Option<Duration>,
        error: String,
    },
    /// A failure that trying again cannot fix: any other status, a row this
    /// release cannot read.
    Permanent { http_status: Option<u16>, error: String },
}

impl CallResult {
    /// The status the downstream answered with; `None` when no answer came
    /// (a timeout, a connection error) or no call was made.
    pub fn http_status(&self) -> Option<u16> {
        match self {
            Self::Succeeded { http_status } => Some(*http_status),
            Self::Transient { http_status, .. } | Self::Permanent { http_status, .. } => *http_status,
        }
    }

    /// A failure without an answer: the call never made it, or never came back.
    pub fn transient(error: String) -> Self {
        Self::Transient {
            http_status: None,
            retry_after: None,
            error,
        }
    }
}

/// The request a row becomes.
#[derive(Debug)]
pub struct Prepared {
    pub command: Command,
    pub url: reqwest::Url,
    /// The endpoint's `Authorization`, sensitive (`Debug` shows `Sensitive`).
    pub authorization: Option<HeaderValue>,
    pub body: Vec<u8>,
}

/// Reads the row; a row this release cannot read is dead, unless a newer
/// relay could read it (then it is retried, for that relay to take).
pub fn prepare(row: &ClaimedRow, endpoints: &Endpoints) -> Result<Prepared, CallResult> {
    let kind = match &row.kind {
        RowKind::Known(kind) => *kind,
        RowKind::Unknown(text) => {
            return Err(CallResult::Permanent {
                http_status: None,
                error: domain::PayloadError::UnknownKind(text.clone()).to_string(),
            });
        }
    };
    let command = Command::from_payload(kind, &row.payload).map_err(|e| {
        if e.is_retryable() {
            CallResult::transient(e.to_string())
        } else {
            CallResult::Permanent {
                http_status: None,
                error: e.to_string(),
            }
        }
    })?;
    let target = endpoints.target(command.kind);
    Ok(Prepared {
        url: target.url.clone(),
        authorization: target.authorization.clone(),
        body: command.request_body(),
        command,
    })
}

/// Sends it, in an HTTP client span (semantic conventions) whose context the
/// request carries as `traceparent`. `attempt` is the row's attempt number:
/// every attempt sends the same request (the same key and body), so from the
/// second on the span counts it as a resend (`http.request.resend_count`).
/// `parent` is the row's stored context, used only when no tracing layer is
/// installed.
pub async fn call(
    http: &reqwest::Client,
    prepared: &Prepared,
    key: &str,
    attempt: i32,
    parent: Option<&str>,
) -> CallResult {
    let url = &prepared.url;
    let span = tracing::info_span!(
        "POST",
        otel.kind = "client",
        otel.status_code = Empty,
        http.request.method = "POST",
        http.request.resend_count = resend_count(attempt),
        url.full = %redacted(url),
        server.address = url.host_str().unwrap_or_default(),
        server.port = url.port_or_known_default().map(i64::from),
        http.response.status_code = Empty,
        error.type = Empty,
    );
    let traceparent = process::traces::traceparent_for(&span, parent);
    let mut request = http
        .post(url.clone())
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .header("traceparent", traceparent);
    if let Some(authorization) = &prepared.authorization {
        request = request.header(AUTHORIZATION, authorization.clone());
    }
    let result = request
        .body(prepared.body.clone())
        .send()
        .instrument(span.clone())
        .await;
    match result {
        Ok(response) => {
            let status = response.status();
            span.record("http.response.status_code", i64::from(status.as_u16()));
            if !status.is_success() {
                span.record("otel.status_code", "ERROR");
                span.record("error.type", status.as_u16().to_string());
            }
            classify(response, prepared.authorization.as_ref()).await
        }
        Err(e) => {
            // No URL in what is logged and stored: the error's text is enough.
            let e = e.without_url();
            span.record("otel.status_code", "ERROR");
            span.record(
                "error.type",
                if e.is_timeout() {
                    "timeout"
                } else if e.is_connect() {
                    "connect"
                } else {
                    "transport"
                },
            );
            CallResult::transient(describe_transport_error(&e))
        }
    }
}

/// `http.request.resend_count` for a row's `attempt`: none on the first
/// (the conventions count resends only), then the attempts before it.
fn resend_count(attempt: i32) -> Option<i64> {
    (attempt > 1).then(|| i64::from(attempt) - 1)
}

/// The URL as a span may show it: a username or password in it becomes
/// `REDACTED`, as the semantic conventions for `url.full` ask. The
/// configuration already moves them out of the URL (into the endpoint's
/// `Authorization`); this is the last guard.
fn redacted(url: &reqwest::Url) -> std::borrow::Cow<'_, reqwest::Url> {
    if url.username().is_empty() && url.password().is_none() {
        return std::borrow::Cow::Borrowed(url);
    }
    let mut shown = url.clone();
    let _ = shown.set_username("REDACTED");
    let _ = shown.set_password(Some("REDACTED"));
    std::borrow::Cow::Owned(shown)
}

/// `authorization` is the one the call carried: a downstream that echoes it
/// in its error body does not get it into `last_error` or a log line.
async fn classify(response: reqwest::Response, authorization: Option<&HeaderValue>) -> CallResult {
    let status = response.status();
    let http_status = Some(status.as_u16());
    if status.is_success() {
        return CallResult::Succeeded {
            http_status: status.as_u16(),
        };
    }
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_retry_after);
    // A short excerpt of the body helps whoever reads `dead list`. At most
    // `ERROR_BODY_LIMIT` bytes of it are read; the rest never is (the
    // connection is dropped), so a huge or endless body costs nothing.
    // Scrubbed before it is cut, so no part of a credential survives the cut.
    let body = scrub(&read_capped(response, ERROR_BODY_LIMIT).await, authorization);
    let excerpt: String = body
        .chars()
        .take(200)
        .collect::<String>()
        .replace(['\n', '\r'], " ");
    let error = format!("HTTP {}: {}", status.as_u16(), excerpt.trim());
    if is_retryable_status(status) {
        CallResult::Transient {
            http_status,
            retry_after,
            error,
        }
    } else {
        CallResult::Permanent { http_status, error }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_second_attempt_is_the_first_resend() {
        assert_eq!(resend_count(1), None);
        assert_eq!(resend_count(2), Some(1));
        assert_eq!(resend_count(7), Some(6));
    }

    #[test]
    fn credentials_in_a_url_are_redacted_for_spans() {
        let url = reqwest::Url::parse("https://ops:s3cret@f.example:8443/v1/shipments").unwrap();
        let shown = redacted(&url).to_string();
        assert_eq!(shown, "https://REDACTED:REDACTED@f.example:8443/v1/shipments");
        let plain = reqwest::Url::parse("http://f.example/shipments").unwrap();
        assert_eq!(redacted(&plain).as_str(), "http://f.example/shipments");
    }

    #[test]
    fn rows_become_requests() {
        let downstream = |url: &str, authorization: Option<&str>| Downstream {
            base_url: reqwest::Url::parse(url).unwrap(),
            authorization: authorization.map(|a| process::Secret::new(a.to_owned())),
        };
        let endpoints = Endpoints::new(
            &downstream("http://f.example", Some("Bearer t0ken")),
            &downstream("http://e.example/v1/", None),
        )
        .unwrap();
        let row = |kind: &str, payload: serde_json::Value| ClaimedRow {
            id: 1,
            kind: RowKind::parse(kind),
            payload,
            idempotency_key: "k".into(),
            attempt: 1,
            claim: 1,
            trace_context: None,
            event_id: "evt".into(),
            due_at: 0.0,
            lease_expires: std::time::Instant::now(),
        };
        let p = prepare(
            &row(
                "ship_order",
                serde_json::json!({"v": 1, "order_id": 5, "event_id": "evt"}),
            ),
            &endpoints,
        )
        .unwrap();
        assert_eq!(p.url.as_str(), "http://f.example/shipments");
        let authorization = p.authorization.as_ref().unwrap();
        assert_eq!(authorization, "Bearer t0ken");
        assert!(authorization.is_sensitive());
        assert!(!format!("{p:?}").contains("t0ken"), "{p:?}");
        assert_eq!(p.body, br#"{"order_id":5,"event_id":"evt"}"#);
        let p = prepare(
            &row(
                "send_refund_notice",
                serde_json::json!({"v": 1, "order_id": 5, "event_id": "e"}),
            ),
            &endpoints,
        )
        .unwrap();
        assert_eq!(p.url.as_str(), "http://e.example/v1/emails");
        assert!(p.authorization.is_none());
        assert!(matches!(
            prepare(&row("teleport", serde_json::json!({"v": 1})), &endpoints),
            Err(CallResult::Permanent {
                http_status: None,
                ..
            })
        ));
        assert!(matches!(
            prepare(&row("ship_order", serde_json::json!({"v": 9})), &endpoints),
            Err(CallResult::Transient {
                http_status: None,
                ..
            })
        ));
    }
}
