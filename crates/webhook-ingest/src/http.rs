//! `POST /webhooks/payments`: size, signature, parse, then one statement.
//!
//! The order matters: the size limit first (an oversized body is 413 whatever
//! its signature), the signature before anything touches the database (an
//! unverified request must not be able to insert a dedup row and suppress the
//! real event), and the whole of it under one deadline.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::{HttpRequest, HttpResponse, web};
use bytes::BytesMut;
use domain::ProviderEvent;
use futures_util::StreamExt as _;
use tokio::time::timeout_at;
use tokio_postgres::CancelToken;
use tokio_postgres::error::SqlState;
use tracing::Instrument as _;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::batch::Answer;
use crate::error::{IngestError, MAX_BODY_BYTES};
use crate::metrics::IngestMetrics;
use crate::storage::{self, Delivery, Recorded};

/// Header marking a replayed response.
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";

pub struct AppState {
    pub pool: db::Pool,
    /// Where the pool's statements go, as their client spans say it.
    pub span_server: db::span::Server,
    /// Cancels a statement the deadline abandons, on the server.
    pub canceller: db::connect::Canceller,
    pub verifier: signature::Verifier,
    pub deadline: Duration,
    pub metrics: IngestMetrics,
    pub notifier: Arc<crate::notifier::Notifier>,
    /// Permits for verified requests in flight (`INGEST_MAX_IN_FLIGHT`).
    pub in_flight: Arc<tokio::sync::Semaphore>,
    /// Slots for requests whose body is being read and verified
    /// ([`READERS_PER_PERMIT`] per permit).
    pub readers: Arc<tokio::sync::Semaphore>,
    /// Connections that deliveries waiting for a locked order may hold at
    /// once, trying again (see [`record`]).
    pub lock_retries: Arc<tokio::sync::Semaphore>,
    /// Payments waiting for a connection, recorded several per statement
    /// (see [`crate::batch`]).
    pub batcher: Arc<crate::batch::Batcher>,
}

/// The handler: the server span, outcome, metrics and logging around [`process`].
pub async fn receive(req: HttpRequest, body: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    let started = Instant::now();
    let deadline = tokio::time::Instant::from_std(started) + state.deadline;
    // HTTP server span (OpenTelemetry semantic conventions). It is not
    // started (entered, or given children) until the delivery is verified:
    // only then may it continue the provider's trace (see [`process`]);
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
        http.route = crate::startup::WEBHOOK_PATH,
        url.path = crate::startup::WEBHOOK_PATH,
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
    let result = process(&req, body, &state, started, deadline, &span).await;
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
/// take only reading slots, each for at most [`body_bound`], and never the
/// permits that real webhooks need.
async fn process(
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
        let body_deadline = tokio::time::Instant::from_std(started) + body_bound(state.deadline);
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
    record(body, state, deadline, &trace_context)
        .instrument(span.clone())
        .await
}

/// How long a request's body may take to arrive, from the request's first
/// byte: half its deadline. A provider sends a webhook's few kilobytes in
/// one go; a client that needs longer is answered 503 (retry) and keeps the
/// other half of the deadline from being spent on its database work.
fn body_bound(deadline: Duration) -> Duration {
    deadline / 2
}

/// Reading slots for each in-flight permit: bodies being read (and
/// verified) at once, beyond which a request is shed at once. Each slot
/// costs only the bytes its client actually sent (at most 256 KiB).
pub const READERS_PER_PERMIT: usize = 4;

/// Parses the verified `body` and runs the one statement, in the request's span.
///
/// A try that finds the event's order locked for longer than the session's
/// `lock_timeout` (by the shop, or by a slow delivery) fails with
/// `lock_not_available` and changes nothing; the delivery then waits, holding
/// no connection, and tries again until its deadline (a 503 then, which the
/// provider retries). Tries after the first take one of the few
/// `lock_retries` slots first, so however many deliveries wait for one
/// order's lock, most of the pool stays free for every other order.
async fn record(
    body: bytes::Bytes,
    state: &AppState,
    deadline: tokio::time::Instant,
    trace_context: &str,
) -> Result<Recorded, IngestError> {
    let event = Arc::new(ProviderEvent::parse(&body)?);
    let span = tracing::Span::current();
    span.record("webhook.event_id", event.id.as_str());
    span.record("webhook.event_type", event.event_type.as_str());
    let raw: Arc<str> = std::str::from_utf8(&body)
        .map_err(|e| IngestError::BodyRead(e.to_string()))?
        .into();

    // A payment's first try is queued, and recorded with whatever other
    // payments arrived while the statement before them ran (crate::batch).
    let mut first = None;
    if storage::batchable(&event) {
        match state
            .batcher
            .record(&event, &raw, deadline, trace_context)
            .await?
        {
            Answer::Tried(answer) => first = Some(answer),
            Answer::Alone => {}
            Answer::Deadline => return Err(IngestError::Deadline),
            Answer::Unavailable(error) => return Err(IngestError::Unavailable(error)),
        }
    }

    let mut tries: u32 = 0;
    loop {
        tries += 1;
        let slot = if tries == 1 {
            None
        } else {
            let slot = timeout_at(deadline, state.lock_retries.clone().acquire_owned())
                .await
                .map_err(|_| IngestError::Deadline)?
                .map_err(|e| IngestError::Unexpected(e.into()))?;
            Some(slot)
        };
        let answer = match first.take() {
            Some(answer) => answer,
            None => try_record(&event, &raw, state, deadline, trace_context).await?,
        };
        match answer {
            Ok(recorded) => {
                if recorded.enqueued() > 0 {
                    state.notifier.notify();
                }
                return Ok(recorded);
            }
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                state.metrics.lock_waits.inc();
                if tries == 1 {
                    tracing::info!("the order is locked; waiting without a connection, then trying again");
                }
                drop(slot);
                let pause = lock_backoff(tries);
                if tokio::time::Instant::now() + pause >= deadline {
                    tokio::time::sleep_until(deadline).await;
                    tracing::warn!(tries, "the order stayed locked until the deadline");
                    return Err(IngestError::Deadline);
                }
                tokio::time::sleep(pause).await;
            }
            Err(e) if is_retryable(&e) => {
                return Err(IngestError::Unavailable(process::logs::error_chain(&e)));
            }
            Err(e) => return Err(anyhow::Error::new(e).context("recording the event").into()),
        }
    }
}

/// The pause before try `tries + 1` for a locked order: 10 ms, doubling up
/// to 160 ms, with full jitter (so the waiters of one lock spread out).
fn lock_backoff(tries: u32) -> Duration {
    let ceiling = Duration::from_millis(10) * 2u32.pow(tries.saturating_sub(1).min(4));
    ceiling.mul_f64(rand::random::<f64>().max(0.1))
}

/// One try of the record statement on a pooled connection ([`record_alone`]).
async fn try_record(
    event: &Arc<ProviderEvent>,
    raw: &Arc<str>,
    state: &AppState,
    deadline: tokio::time::Instant,
    trace_context: &str,
) -> Result<Result<Recorded, tokio_postgres::Error>, IngestError> {
    let client = timeout_at(deadline, state.pool.get())
        .await
        .map_err(|_| IngestError::Deadline)?
        .map_err(|e| IngestError::Unavailable(process::logs::error_chain(&e)))?;
    let span = storage::record_span(&tracing::Span::current(), &state.span_server, event);
    record_alone(
        client,
        event,
        raw,
        trace_context,
        deadline,
        &span,
        &state.canceller,
        &state.notifier,
        state.deadline,
    )
    .await
}

/// One delivery's record statement on `client`, in `span` (its client span,
/// [`storage::record_span`], as far as the delivery waits for it), under the
/// deadline: `Err` when the deadline passed (the statement is abandoned and
/// cancelled, see [`abandon`]), else the statement's own answer, its
/// connection back in the pool.
#[expect(
    clippy::too_many_arguments,
    reason = "the lone statement and the batch of one share it, each holding these parts apart"
)]
pub(crate) async fn record_alone(
    client: db::Client,
    event: &Arc<ProviderEvent>,
    raw: &Arc<str>,
    trace_context: &str,
    deadline: tokio::time::Instant,
    span: &tracing::Span,
    canceller: &db::connect::Canceller,
    notifier: &Arc<crate::notifier::Notifier>,
    wait: Duration,
) -> Result<Result<Recorded, tokio_postgres::Error>, IngestError> {
    // Taken now: once the statement is sent, its connection belongs to it.
    let session = canceller.session_of(&client);
    let mut recording = Box::pin(record_on(
        client,
        event.clone(),
        raw.clone(),
        trace_context.to_owned(),
    ));
    let Ok((client, result)) = timeout_at(deadline, &mut recording)
        .instrument(span.clone())
        .await
    else {
        db::span::timed_out(span);
        abandon(recording, session, canceller, notifier, wait, &event.id).await;
        return Err(IngestError::Deadline);
    };
    // Its statement has answered: the connection goes back to the pool clean.
    drop(client);
    if let Err(e) = &result {
        db::span::failed(span, e);
    }
    Ok(result)
}

/// What the record statement gives back: its connection, and its answer.
type Answered = (db::Client, Result<Recorded, tokio_postgres::Error>);

/// What an abandoned statement that committed after all wrote, for its log
/// line and the relays' wake-up.
pub(crate) trait Landed {
    /// Deliveries it claimed (first deliveries).
    fn claimed(&self) -> usize;
    /// Commands it enqueued.
    fn enqueued(&self) -> i32;
}

impl Landed for Recorded {
    fn claimed(&self) -> usize {
        usize::from(self.delivery != Delivery::Replay)
    }

    fn enqueued(&self) -> i32 {
        Recorded::enqueued(self)
    }
}

/// The record statement on a connection it owns, so that a statement the
/// deadline abandons can be handed to [`abandon`] together with its
/// connection.
async fn record_on(
    client: db::Client,
    event: Arc<ProviderEvent>,
    raw: Arc<str>,
    trace_context: String,
) -> Answered {
    let client = InFlight::new(client);
    let result = storage::record_event(client.get(), &event, &raw, Some(&trace_context)).await;
    (client.answered(), result)
}

/// A pooled connection with a statement in flight. Dropped before the
/// statement answered, it is discarded rather than returned to the pool busy
/// with a statement nobody waits for.
pub(crate) struct InFlight(Option<db::Client>);

impl InFlight {
    pub(crate) fn new(client: db::Client) -> Self {
        Self(Some(client))
    }

    pub(crate) fn get(&self) -> &db::Client {
        self.0.as_ref().expect("only `answered` takes the connection")
    }

    pub(crate) fn answered(mut self) -> db::Client {
        self.0.take().expect("only `answered` takes the connection")
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            client.discard();
        }
    }
}

/// How long past the deadline the 503 waits for a cancelled statement to
/// end. On a reachable server a cancel takes a connection and a round trip,
/// a millisecond or two, so the answer normally leaves once the statement
/// has ended (rolled back, or committed just before the cancel arrived); an
/// unreachable server costs the answer no more than this.
pub(crate) const CANCEL_GRACE: Duration = Duration::from_millis(100);

/// The deadline passed with the record statement still running. Dropping it
/// would not stop it: the server would run it on and might commit after the
/// provider was told to retry; closing its connection would stop it only at
/// the server's next check for a vanished client, if it makes any (see
/// `db::connect::Canceller`). So the server
/// is asked to cancel it, and the answer waits for it to end, up to
/// [`CANCEL_GRACE`]; the rest goes on in the background. There, the
/// statement gets one more deadline to end (`statement_timeout`, the
/// server's own backstop, ends it if the cancel was lost), its fate is
/// logged, and its connection is discarded, never handed to another request
/// while a cancel may still be on its way to its session.
///
/// A commit that wins the race is not an error: the provider's retry finds
/// the claim and is answered with the stored result (`Idempotent-Replayed`).
pub(crate) async fn abandon<F, T>(
    recording: std::pin::Pin<Box<F>>,
    session: CancelToken,
    canceller: &db::connect::Canceller,
    notifier: &Arc<crate::notifier::Notifier>,
    wait: Duration,
    event_id: &str,
) where
    F: Future<Output = (db::Client, Result<T, tokio_postgres::Error>)> + Send + 'static,
    T: Landed + Send + 'static,
{
    let (ended, ended_rx) = tokio::sync::oneshot::channel::<()>();
    let canceller = canceller.clone();
    let notifier = notifier.clone();
    // Its own span (the request's ends with the 503), in the event's trace.
    let span = tracing::info_span!(parent: None, "cancel_abandoned_statement", webhook.event_id = event_id);
    let _ = span.set_parent(tracing::Span::current().context());
    let background = async move {
        let statement = async move {
            let answered = tokio::time::timeout(wait, recording).await;
            let _ = ended.send(());
            answered
        };
        let (cancelled, answered) = tokio::join!(canceller.cancel(&session), statement);
        if let Err(e) = cancelled {
            tracing::warn!(error = %e, "could not send the cancel request; statement_timeout bounds the statement");
        }
        match answered {
            Ok((client, Ok(recorded))) => {
                tracing::warn!(
                    claimed = recorded.claimed(),
                    "the statement committed after all (the cancel came too late): the provider's retry will be answered with the stored result"
                );
                if recorded.enqueued() > 0 {
                    notifier.notify();
                }
                client.discard();
            }
            Ok((client, Err(e))) => {
                match e.as_db_error() {
                    Some(refused) => tracing::info!(
                        error = %refused,
                        "the statement ended without committing (cancelled): nothing written"
                    ),
                    None => tracing::warn!(
                        error = %e,
                        "the connection failed under the statement: a retry is answered whether or not it committed"
                    ),
                }
                client.discard();
            }
            // The future is dropped here, and `InFlight` discards its connection.
            Err(_) => tracing::warn!(
                "the statement did not end within another deadline; its connection is discarded"
            ),
        }
    };
    tokio::spawn(background.instrument(span));
    let _ = tokio::time::timeout(CANCEL_GRACE, ended_rx).await;
}

/// Errors a retry may cure besides the database unreachable, restarting or
/// overloaded: a statement cancelled by its timeout, a serialisation
/// conflict, a deadlock, a lock not granted.
const RETRYABLE: [SqlState; 4] = [
    SqlState::QUERY_CANCELED,
    SqlState::T_R_SERIALIZATION_FAILURE,
    SqlState::T_R_DEADLOCK_DETECTED,
    SqlState::LOCK_NOT_AVAILABLE,
];

fn is_retryable(err: &tokio_postgres::Error) -> bool {
    db::is_connectivity_error(err) || err.code().is_some_and(|c| RETRYABLE.contains(c))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_backoff_doubles_from_10_to_160_ms_with_full_jitter_above_a_tenth() {
        for (tries, ceiling_ms) in [(1, 10), (2, 20), (3, 40), (4, 80), (5, 160), (6, 160), (40, 160)] {
            let ceiling = Duration::from_millis(ceiling_ms);
            let pauses: Vec<Duration> = (0..200).map(|_| lock_backoff(tries)).collect();
            for pause in &pauses {
                assert!(*pause <= ceiling, "try {tries}: {pause:?} above {ceiling:?}");
                assert!(
                    *pause >= ceiling.mul_f64(0.1),
                    "try {tries}: {pause:?} below a tenth"
                );
            }
            // Jittered: the waiters of one lock do not come back together.
            let distinct: std::collections::HashSet<_> = pauses.iter().collect();
            assert!(
                distinct.len() > 100,
                "try {tries}: only {} distinct pauses",
                distinct.len()
            );
        }
    }
}
