//! `POST /webhooks/payments`: read, verify, shed, record, answer.
//!
//! The order matters: the size limit first (an oversized body is 413 whatever
//! its signature), the signature before anything touches the database (an
//! unverified request must not be able to insert a dedup row and suppress the
//! real event), the in-flight limit before any database work, and the whole
//! of it under one deadline. Recording is [`crate::record`]'s.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use actix_web::{HttpRequest, HttpResponse, web};
use bytes::BytesMut;
use domain::ProviderEvent;
use futures_util::StreamExt as _;
use tokio::time::timeout_at;
use tracing::Instrument as _;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::error::{IngestError, MAX_BODY_BYTES};
use crate::metrics::IngestMetrics;
use crate::record::{Deadline, Received, Recorder};
use crate::storage::{Delivery, Recorded};

/// The route the provider posts to.
pub const WEBHOOK_PATH: &str = "/webhooks/payments";

/// Header marking a replayed response.
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";

pub struct AppState {
    pub verifier: signature::Verifier,
    pub deadline: Deadline,
    pub metrics: IngestMetrics,
    /// Permits for verified requests in flight (`INGEST_MAX_IN_FLIGHT`).
    pub in_flight: Arc<tokio::sync::Semaphore>,
    /// Slots for requests whose body is being read and verified
    /// ([`READERS_PER_PERMIT`] per permit).
    pub readers: Arc<tokio::sync::Semaphore>,
    pub recorder: Recorder,
}

/// The handler: the server span, outcome, metrics and logging around [`handle`].
pub async fn receive(req: HttpRequest, body: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    let started = Instant::now();
    let deadline = tokio::time::Instant::from_std(started) + state.deadline.whole();
    // HTTP server span (OpenTelemetry semantic conventions). It is not
    // started (entered, or given children) until the delivery is verified:
    // only then may it continue the provider's trace (see [`handle`]);
    // every other request is a root of its own trace. Of the request's
    // headers it records the user agent alone: never a signature, an
    // authorization or the body. `client.address` is the connection's peer
    // (a proxy's address behind one: a forwarded-for header is anyone's to
    // write, and no proxy is configured as trusted).
    let span = tracing::info_span!(
        "POST /webhooks/payments",
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = "POST",
        http.route = WEBHOOK_PATH,
        url.path = WEBHOOK_PATH,
        url.scheme = "http",
        client.address = req.peer_addr().map(|peer| tracing::field::display(peer.ip())),
        user_agent.original = req
            .headers()
            .get(actix_web::http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok()),
        http.response.status_code = Empty,
        error.type = Empty,
        webhook.event_id = Empty,
        webhook.event_type = Empty,
        webhook.outcome = Empty,
    );
    let result = handle(&req, body, &state, started, deadline, &span).await;
    async move {
        let (response, outcome) = match result {
            Ok(recorded) => {
                let outcome = match recorded.delivery {
                    Delivery::First { outcome, .. } => outcome.as_str(),
                    Delivery::Replay => "duplicate",
                };
                tracing::info!(outcome, enqueued = recorded.enqueued(), "webhook accepted");
                (accepted(recorded), outcome)
            }
            Err(err) => {
                match &err {
                    IngestError::Unexpected(e) => tracing::error!(error = format!("{e:#}"), "webhook failed"),
                    IngestError::Unavailable(_)
                    | IngestError::Deadline
                    | IngestError::SlowBody
                    | IngestError::Overloaded => {
                        tracing::warn!(error = %err, "webhook not processed, provider told to retry");
                    }
                    _ => tracing::info!(error = %err, "webhook rejected"),
                }
                (err.response(), err.outcome())
            }
        };
        let span = tracing::Span::current();
        let status = response.status().as_u16();
        span.record("http.response.status_code", i64::from(status));
        span.record("webhook.outcome", outcome);
        if status >= 500 {
            span.record("otel.status_code", "ERROR");
            span.record("error.type", status.to_string());
        }
        state.metrics.observe(outcome, started.elapsed().as_secs_f64());
        response
    }
    .instrument(span)
    .await
}

fn accepted(recorded: Recorded) -> HttpResponse {
    let mut response = HttpResponse::Ok();
    response.content_type("application/json");
    if recorded.delivery == Delivery::Replay {
        response.insert_header((REPLAYED_HEADER, "true"));
    }
    response.body(recorded.body)
}

/// Reads and verifies the delivery, then records it in `span`. Until the
/// signature is verified nothing runs in `span` (so it is not started): a
/// verified delivery's `traceparent` becomes its parent, and is continued
/// in the outbox rows; an unverified request's is ignored, and its span
/// starts a trace of its own when [`receive`] enters it.
///
/// The body is read under bounds of its own, before any of the
/// `INGEST_MAX_IN_FLIGHT` permits is taken: a permit is held only by a
/// delivery whose signature verified, for its database work. So clients that
/// trickle their bodies (a slow-body attack, before any authentication) can
/// take only reading slots, each for at most [`Deadline::body_bound`], and never the
/// permits that real webhooks need.
async fn handle(
    req: &HttpRequest,
    body: web::Payload,
    state: &AppState,
    started: Instant,
    deadline: tokio::time::Instant,
    span: &tracing::Span,
) -> Result<Recorded, IngestError> {
    let body = {
        // Shed at once when every reading slot is taken.
        let _reading = state
            .readers
            .clone()
            .try_acquire_owned()
            .map_err(|_| IngestError::Overloaded)?;
        let body_deadline = tokio::time::Instant::from_std(started) + state.deadline.body_bound();
        timeout_at(body_deadline, read_body(req, body))
            .await
            .map_err(|_| IngestError::SlowBody)??
    };

    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    // Created (timed) now, placed under the server span once that has its parent.
    let verify_span =
        tracing::info_span!(parent: None, "webhook.verify", scheme = state.verifier.scheme().as_str());
    let verified = state
        .verifier
        .verify(|name| req.headers().get(name).map(|v| v.as_bytes()), &body, now);
    // Only a signed delivery may pick the trace (and the sampled flag) of our
    // spans, and have its context stored and forwarded.
    let incoming = if verified.is_ok() {
        req.headers().get("traceparent").and_then(|v| v.to_str().ok())
    } else {
        None
    };
    if incoming.is_some() {
        let _ = span.set_parent(process::traces::context_from_traceparent(incoming));
    }
    let _ = verify_span.set_parent(span.context());
    drop(verify_span);
    verified?;
    // Shed load before any database work: a full house answers at once.
    let _permit = state
        .in_flight
        .clone()
        .try_acquire_owned()
        .map_err(|_| IngestError::Overloaded)?;
    let trace_context = process::traces::traceparent_for(span, incoming);
    let received = parse(&body, trace_context, deadline, span)?;
    state.recorder.record(&received).instrument(span.clone()).await
}

/// The verified `body` parsed, its id and type on the request's span.
fn parse(
    body: &[u8],
    trace_context: String,
    deadline: tokio::time::Instant,
    span: &tracing::Span,
) -> Result<Received, IngestError> {
    let event = ProviderEvent::parse(body)?;
    span.record("webhook.event_id", event.id.as_str());
    span.record("webhook.event_type", event.event_type.as_str());
    let raw = std::str::from_utf8(body)
        .map_err(|e| IngestError::BodyRead(e.to_string()))?
        .into();
    Ok(Received {
        event: Arc::new(event),
        raw,
        trace_context,
        deadline,
    })
}

/// Reading slots for each in-flight permit: bodies being read (and
/// verified) at once, beyond which a request is shed at once. Each slot
/// costs only the bytes its client actually sent (at most 256 KiB).
pub const READERS_PER_PERMIT: usize = 4;

/// The most a body's buffer holds before its bytes arrive.
const INITIAL_BODY_CAPACITY: usize = 16 * 1024;

async fn read_body(req: &HttpRequest, mut payload: web::Payload) -> Result<bytes::Bytes, IngestError> {
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > MAX_BODY_BYTES) {
        return Err(IngestError::TooLarge);
    }
    // Memory follows the bytes that arrive, not the length a client declares.
    let mut buf = BytesMut::with_capacity(
        declared
            .unwrap_or(INITIAL_BODY_CAPACITY)
            .min(INITIAL_BODY_CAPACITY),
    );
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| IngestError::BodyRead(e.to_string()))?;
        if buf.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(IngestError::TooLarge);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}
