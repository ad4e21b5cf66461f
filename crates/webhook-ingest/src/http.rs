//! `POST /webhooks/payments`: size, signature, parse, then one statement.
//!
//! The order matters: the size limit first (an oversized body is 413 whatever
//! its signature), the signature before anything touches the database (an
//! unverified request must not be able to insert a dedup row and suppress the
//! real event), and the whole of it under one deadline.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::{HttpRequest, HttpResponse, web};
use bytes::BytesMut;
use domain::{Outcome, ProviderEvent};
use futures_util::StreamExt as _;
use tokio::time::timeout_at;
use tracing::Instrument as _;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::error::{IngestError, MAX_BODY_BYTES};
use crate::metrics::IngestMetrics;
use crate::storage::{self, Recorded};

/// Header marking a replayed response.
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";

pub struct AppState {
    pub pool: db::Pool,
    pub verifier: signature::Verifier,
    pub deadline: Duration,
    pub metrics: IngestMetrics,
    pub notifier: std::sync::Arc<crate::notifier::Notifier>,
    /// Permits for requests in flight (`INGEST_MAX_IN_FLIGHT`).
    pub in_flight: std::sync::Arc<tokio::sync::Semaphore>,
}

/// The handler: the server span, outcome, metrics and logging around [`process`].
pub async fn receive(req: HttpRequest, body: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    let started = Instant::now();
    let deadline = tokio::time::Instant::from_std(started) + state.deadline;
    // HTTP server span (OpenTelemetry semantic conventions), continuing the
    // provider's trace when it sends one.
    let incoming = req.headers().get("traceparent").and_then(|v| v.to_str().ok());
    let span = tracing::info_span!(
        "POST /webhooks/payments",
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = "POST",
        http.route = crate::startup::WEBHOOK_PATH,
        url.path = crate::startup::WEBHOOK_PATH,
        url.scheme = "http",
        http.response.status_code = Empty,
        error.type = Empty,
        webhook.event_id = Empty,
        webhook.event_type = Empty,
        webhook.outcome = Empty,
    );
    if incoming.is_some() {
        let _ = span.set_parent(service::traces::context_from_traceparent(incoming));
    }
    let trace_context = service::traces::traceparent_for(&span, incoming);
    async move {
        // Shed load before doing any work: a full house answers at once.
        let permit = state.in_flight.clone().try_acquire_owned();
        let result = match permit {
            Ok(_permit) => process(&req, body, &state, deadline, &trace_context).await,
            Err(_) => Err(IngestError::Overloaded),
        };
        let (response, outcome) = match result {
            Ok(recorded) => {
                let outcome = if recorded.claimed {
                    outcome_of(&recorded)
                } else {
                    "duplicate"
                };
                tracing::info!(outcome, enqueued = recorded.enqueued, "webhook accepted");
                (accepted(recorded), outcome)
            }
            Err(err) => {
                match &err {
                    IngestError::Unexpected(e) => tracing::error!(error = format!("{e:#}"), "webhook failed"),
                    IngestError::Unavailable(_) | IngestError::Deadline | IngestError::Overloaded => {
                        tracing::warn!(error = %err, "webhook not processed, provider told to retry")
                    }
                    _ => tracing::info!(error = %err, "webhook rejected"),
                }
                (err.response(), err.outcome())
            }
        };
        let span = tracing::Span::current();
        let status = response.status().as_u16();
        span.record("http.response.status_code", status);
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
    if !recorded.claimed {
        response.insert_header((REPLAYED_HEADER, "true"));
    }
    response.body(recorded.body)
}

/// The metric label of a newly processed event: its recorded status.
fn outcome_of(recorded: &Recorded) -> &'static str {
    Outcome::parse(&recorded.status).map_or("processed", Outcome::as_str)
}

async fn process(
    req: &HttpRequest,
    body: web::Payload,
    state: &AppState,
    deadline: tokio::time::Instant,
    trace_context: &str,
) -> Result<Recorded, IngestError> {
    let body = timeout_at(deadline, read_body(req, body))
        .await
        .map_err(|_| IngestError::Deadline)??;

    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    tracing::info_span!("webhook.verify", scheme = state.verifier.scheme().as_str()).in_scope(|| {
        state
            .verifier
            .verify(|name| req.headers().get(name).map(|v| v.as_bytes()), &body, now)
    })?;

    let event = ProviderEvent::parse(&body)?;
    let span = tracing::Span::current();
    span.record("webhook.event_id", event.id.as_str());
    span.record("webhook.event_type", event.event_type.as_str());
    let raw = std::str::from_utf8(&body).map_err(|e| IngestError::BodyRead(e.to_string()))?;

    let client = timeout_at(deadline, state.pool.get())
        .await
        .map_err(|_| IngestError::Deadline)?
        .map_err(|e| IngestError::Unavailable(e.to_string()))?;
    // Database client span (semantic conventions): the one statement.
    let db_span = tracing::info_span!(
        "record_event",
        otel.kind = "client",
        otel.status_code = Empty,
        db.system.name = "postgresql",
        db.operation.name = "record_event",
        db.query.summary = "record_event processed_events orders outbox",
    );
    let recording =
        storage::record_event(&client, &event, raw, Some(trace_context)).instrument(db_span.clone());
    let result = timeout_at(deadline, recording).await;
    if !matches!(result, Ok(Ok(_))) {
        db_span.record("otel.status_code", "ERROR");
    }
    match result {
        Ok(Ok(recorded)) => {
            if recorded.enqueued > 0 {
                state.notifier.notify();
            }
            Ok(recorded)
        }
        Ok(Err(e)) if is_retryable(&e) => Err(IngestError::Unavailable(e.to_string())),
        Ok(Err(e)) => Err(anyhow::Error::new(e).context("recording the event").into()),
        Err(_) => {
            // The statement may still be running: take the connection out of
            // the pool and close it, so the server cancels and rolls back
            // (client_connection_check_interval) instead of committing later.
            client.discard();
            Err(IngestError::Deadline)
        }
    }
}

/// Errors a retry may cure: the database unreachable, restarting, overloaded,
/// a statement cancelled by its timeout, a serialisation conflict.
fn is_retryable(err: &tokio_postgres::Error) -> bool {
    db::is_connectivity_error(err)
        || err
            .code()
            .is_some_and(|c| matches!(c.code(), "57014" | "40001" | "40P01" | "55P03"))
}

async fn read_body(req: &HttpRequest, mut payload: web::Payload) -> Result<bytes::Bytes, IngestError> {
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > MAX_BODY_BYTES) {
        return Err(IngestError::TooLarge);
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(8 * 1024).min(MAX_BODY_BYTES));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| IngestError::BodyRead(e.to_string()))?;
        if buf.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(IngestError::TooLarge);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}
