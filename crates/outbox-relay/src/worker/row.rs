//! One claimed row's part: whether it may still be sent, the call in its
//! span, the one log line, and a panic contained. Each ends in exactly one
//! [`Settled`], which the recorder records and gives the row's room back on.

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use domain::CommandKind;
use futures_util::FutureExt as _;
use tracing::Instrument as _;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::Relay;
use crate::dispatch::{self, CallResult};
use crate::storage::{self, ClaimedRow, RowKind, RowVerdict, Verdict};

/// How long a claimed shipment may wait for a call slot and still be sent
/// without asking the database whether a refund cancelled it meanwhile.
/// Rows wait for a slot when the calls are saturated: with a fast downstream
/// for a few milliseconds (a look-up per row would cost more than the call:
/// measured, the drain rate fell by a third), with a slow one for seconds,
/// where a refund can land in the wait and the look-up costs nothing beside
/// the calls. So "under way" means: claimed, and sent within this long or
/// checked first.
pub(super) const RECHECK_AFTER: Duration = Duration::from_millis(50);

/// A held row, settled: the verdict to record for it (under its claim), and
/// what the metrics count of its call.
#[derive(Debug, Clone)]
pub(super) struct Settled {
    pub(super) row: RowVerdict,
    pub(super) kind: RowKind,
    /// How long the call took (0 for a row never sent).
    pub(super) seconds: f64,
}

impl Settled {
    /// A row that was never sent.
    pub(super) fn released(row: ClaimedRow) -> Self {
        Self {
            row: RowVerdict {
                id: row.id,
                claim: row.claim,
                verdict: Verdict::Release,
            },
            kind: row.kind,
            seconds: 0.0,
        }
    }
}

impl Relay {
    /// Whether a shipment that waited for a call slot after its claim (longer
    /// than [`RECHECK_AFTER`]) was cancelled meanwhile (its order refunded).
    /// It was not yet under way, so it must not be sent: the release records
    /// nothing but the lease's end. Only shipments can be cancelled. If the
    /// database cannot say, the row is not sent either.
    pub(super) async fn cancelled_while_waiting(&self, row: &ClaimedRow) -> bool {
        if row.kind != RowKind::Known(CommandKind::ShipOrder) {
            return false;
        }
        let still_pending = match self.pool.get().await {
            Ok(client) => {
                // In the event's trace, beside the attempt it may prevent.
                let span = db::client_span!(parent: None, &self.span_server, super::STILL_PENDING_SUMMARY);
                let _ = span.set_parent(process::traces::context_from_traceparent(
                    row.trace_context.as_deref(),
                ));
                let answer = storage::still_pending(&client, row, &self.config.owner).await;
                if let Err(e) = &answer {
                    db::span::failed(&span, e);
                }
                answer
            }
            Err(e) => {
                tracing::warn!(outbox_id = row.id, error = %e, "cannot check a waiting shipment; released");
                return true;
            }
        };
        match still_pending {
            Ok(true) => false,
            Ok(false) => {
                tracing::info!(
                    outbox_id = row.id,
                    event_id = %row.event_id,
                    "shipment cancelled while it waited for a call slot; not sent"
                );
                true
            }
            Err(e) => {
                tracing::warn!(outbox_id = row.id, error = %e, "cannot check a waiting shipment; released");
                true
            }
        }
    }

    /// Sends the row if its lease will outlast the call, else hands it back.
    ///
    /// A row waits for a call slot after its claim; when calls are slow (a
    /// downstream timing out) the wait can eat the lease. Sending then could
    /// overlap with another claim of the same row (the lease's whole point),
    /// so the row goes back to the queue instead, due at once, its attempt
    /// undone.
    pub(super) async fn send_or_release(&self, row: ClaimedRow) -> Settled {
        // The call must end (at worst by its timeout) while the lease holds;
        // recording a moment after is fenced on the claim anyway.
        if Instant::now() + self.config.http_timeout >= row.lease_expires {
            tracing::debug!(outbox_id = row.id, "lease too short to send; released");
            return Settled::released(row);
        }
        self.deliver(row).await
    }

    /// Runs one row's `work`, containing a panic in it.
    ///
    /// Uncontained, a panic ends the row's task before it hands a [`Settled`]
    /// to the recorder: the row's room among the held rows is never given
    /// back (enough such rows and the relay stops claiming) and the row waits
    /// out its lease. Contained, it is a failed attempt like a 503: retried
    /// after a backoff, dead once `RELAY_MAX_ATTEMPTS` are used up.
    pub(super) async fn contain<F>(&self, row: ClaimedRow, work: impl FnOnce(ClaimedRow) -> F) -> Settled
    where
        F: Future<Output = Settled>,
    {
        let (id, attempt, claim) = (row.id, row.attempt, row.claim);
        let (kind, event_id) = (row.kind.clone(), row.event_id.clone());
        let started = Instant::now();
        // Unwind safety: of the row only the copies above are read after a
        // panic, and what the work shares with other rows (the HTTP client,
        // the metrics) sees the panic as it would a cancelled call: the
        // work's future dropped part-way.
        let result = AssertUnwindSafe(async move { work(row).await })
            .catch_unwind()
            .await;
        let panic = match result {
            Ok(settled) => return settled,
            Err(panic) => panic,
        };
        let error = format!(
            "relay panicked while dispatching: {}",
            panic_message(panic.as_ref())
        );
        let verdict = self.policy.verdict(attempt, CallResult::transient(error.clone()));
        tracing::error!(
            outbox_id = id,
            event_id,
            kind = kind.as_str(),
            attempt,
            outcome = verdict.as_str(),
            error,
            "relay panicked while dispatching; recorded as a failed attempt"
        );
        Settled {
            row: RowVerdict { id, claim, verdict },
            kind,
            seconds: started.elapsed().as_secs_f64(),
        }
    }

    /// One call for one row, and the verdict to record, in an
    /// `outbox.dispatch` span continuing the event's trace (stored on the row
    /// by the ingest), so every attempt, hours apart or not, joins it.
    async fn deliver(&self, row: ClaimedRow) -> Settled {
        let span = tracing::info_span!(
            "outbox.dispatch",
            otel.kind = "consumer",
            otel.status_code = Empty,
            webhook.event_id = %row.event_id,
            outbox.id = row.id,
            outbox.kind = %row.kind,
            outbox.attempt = row.attempt,
            idempotency_key = %row.idempotency_key,
            outbox.outcome = Empty,
        );
        let _ = span.set_parent(process::traces::context_from_traceparent(
            row.trace_context.as_deref(),
        ));
        self.deliver_in_span(row).instrument(span).await
    }

    /// The call, then its one log line (docs/CONTRACT.md, section 8): `outcome`,
    /// `http_status` (absent when no answer came: a timeout, a connection
    /// error, a payload never sent), `duration_ms`, and for a failure the
    /// `error`; the span lifts `event_id`, `outbox_id`, `kind`, `attempt`,
    /// `idempotency_key`, `trace_id` and `span_id` onto it. Done and retry
    /// are `info` and dead is `warn`, so the default level (`RUST_LOG`
    /// unset) tells every call's story.
    async fn deliver_in_span(&self, row: ClaimedRow) -> Settled {
        let started = Instant::now();
        let result = match dispatch::prepare(&row, &self.endpoints) {
            Ok(prepared) => {
                dispatch::call(
                    &self.http,
                    &prepared,
                    &row.idempotency_key,
                    row.attempt,
                    row.trace_context.as_deref(),
                )
                .await
            }
            Err(unsent) => unsent,
        };
        let http_status = result.http_status();
        let verdict = self.policy.verdict(row.attempt, result);
        let elapsed = started.elapsed();
        // Whole microseconds, in milliseconds.
        let duration_ms = elapsed.as_micros() as f64 / 1000.0;
        let span = tracing::Span::current();
        span.record("outbox.outcome", verdict.as_str());
        match &verdict {
            Verdict::Done => {
                tracing::info!(
                    outcome = "done",
                    http_status,
                    duration_ms,
                    "downstream call finished"
                );
            }
            Verdict::Retry { delay, error } => {
                span.record("otel.status_code", "ERROR");
                tracing::info!(
                    outcome = "retry",
                    http_status,
                    duration_ms,
                    retry_in_ms = delay.as_millis() as u64,
                    error,
                    "downstream call finished"
                );
            }
            Verdict::Dead { error } => {
                span.record("otel.status_code", "ERROR");
                tracing::warn!(
                    outcome = "dead",
                    http_status,
                    duration_ms,
                    error,
                    "downstream call finished"
                );
            }
            // Not the verdict on a call: the policy never reaches it.
            Verdict::Release => {}
        }
        Settled {
            row: RowVerdict {
                id: row.id,
                claim: row.claim,
                verdict,
            },
            kind: row.kind,
            seconds: elapsed.as_secs_f64(),
        }
    }
}

/// The text of a panic's payload (`panic!` with a literal or a format string).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a payload that is not a string)")
}
