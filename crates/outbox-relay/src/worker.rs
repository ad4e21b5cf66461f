//! The relay loop.
//!
//! ```text
//!  claimer ──claim batch──▶ row tasks (≤ RELAY_CONCURRENCY calls in flight) ──outcome──▶ recorder
//!     ▲  wakes on NOTIFY, a poll tick, or room freed                                     │
//!     └──────────────────── room freed (rows recorded) ◀─────────────────────────────────┘
//! ```
//!
//! - The claimer holds at most `RELAY_CONCURRENCY + RELAY_BATCH_SIZE` rows: the
//!   calls in flight plus one batch waiting for a slot, so a slot never waits
//!   for a claim round trip, and no more rows are leased than can be sent
//!   well within their lease.
//! - Outcomes are recorded in batches by one recorder: one statement per batch
//!   instead of one per row.
//! - Shutdown: the claimer stops; rows not yet started are released (back to
//!   pending, due now, their attempt undone); calls in flight finish (each
//!   bounded by the HTTP timeout) and are recorded; then the loop returns.
//!
//! [`Relay::relay_once`] runs one claim-send-record cycle to completion, for
//! tests and tools that want to drain deterministically.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::config::RelayConfig;
use crate::dispatch::{self, Endpoints, RetryPolicy};
use crate::metrics::RelayMetrics;
use crate::storage::{self, ClaimedRow, Completion};

/// What one cycle did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Relayed(usize),
    Empty,
}

/// Health of the loop, for `/readyz`.
#[derive(Debug, Default)]
pub struct LoopHealth {
    /// Unix ms of the last claim attempt that reached the database.
    pub last_claim_ms: AtomicI64,
    /// 1 while the LISTEN connection is up.
    pub listening: AtomicUsize,
}

pub struct Relay {
    pool: db::Pool,
    http: reqwest::Client,
    endpoints: Endpoints,
    policy: RetryPolicy,
    config: RelayConfig,
    metrics: RelayMetrics,
    /// Woken by NOTIFY (through the listener) and by freed room.
    wake: Arc<Notify>,
    pub health: Arc<LoopHealth>,
}

/// A finished call, on its way to the recorder.
#[derive(Clone)]
struct Finished {
    row_id: i64,
    attempt: i32,
    /// The claim's fencing token ([`ClaimedRow::claim`]).
    claim: i32,
    kind: String,
    completion: Completion,
    seconds: f64,
}

impl Relay {
    pub fn new(pool: db::Pool, config: RelayConfig, metrics: RelayMetrics) -> anyhow::Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        // One client per process: connection pooling and keep-alive to each
        // downstream host. The timeout bounds the whole call, connect included.
        let http = reqwest::Client::builder()
            .timeout(config.http_timeout)
            .connect_timeout(config.http_timeout.min(Duration::from_secs(5)))
            .pool_max_idle_per_host(config.concurrency as usize)
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            // A redirect on a POST is a misconfiguration, not something to follow.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("outbox-relay/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            pool,
            http,
            endpoints: Endpoints::new(&config.fulfilment_url, &config.email_url)
                .map_err(anyhow::Error::msg)?,
            policy: RetryPolicy {
                max_attempts: config.max_attempts,
                base: config.backoff_base,
                max: config.backoff_max,
            },
            config,
            metrics,
            wake: Arc::new(Notify::new()),
            health: Arc::new(LoopHealth::default()),
        })
    }

    /// The handle NOTIFY wakes the claimer through.
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    pub fn owner(&self) -> &str {
        &self.config.owner
    }

    /// One claim, every call of the batch, one recording.
    pub async fn relay_once(&self) -> anyhow::Result<Outcome> {
        let rows = self.claim(self.config.batch_size as i64).await?;
        if rows.is_empty() {
            return Ok(Outcome::Empty);
        }
        let n = rows.len();
        let calls = Arc::new(Semaphore::new(self.config.concurrency as usize));
        let finished = futures_util::future::join_all(rows.into_iter().map(|row| {
            let calls = calls.clone();
            async move {
                let _slot = calls.acquire().await.expect("never closed");
                self.send_or_release(row).await
            }
        }))
        .await;
        self.record(&finished).await?;
        Ok(Outcome::Relayed(n))
    }

    async fn claim(&self, limit: i64) -> anyhow::Result<Vec<ClaimedRow>> {
        let client = self.pool.get().await?;
        let rows = storage::claim_due_batch(
            &client,
            limit,
            &self.config.owner,
            self.config.lease,
            self.config.max_attempts,
        )
        .await?;
        self.health.last_claim_ms.store(now_ms(), Ordering::Relaxed);
        Ok(rows)
    }

    /// Sends the row if its lease will outlast the call, else hands it back.
    ///
    /// A row waits for a call slot after its claim; when calls are slow (a
    /// downstream timing out) the wait can eat the lease. Sending then could
    /// overlap with another claim of the same row (the lease's whole point),
    /// so the row goes back to the queue instead, due at once, its attempt
    /// undone.
    async fn send_or_release(&self, row: ClaimedRow) -> Finished {
        // The call must end (at worst by its timeout) while the lease holds;
        // recording a moment after is fenced on the claim's attempt anyway.
        if Instant::now() + self.config.http_timeout >= row.lease_expires {
            tracing::debug!(outbox_id = row.id, "lease too short to send; released");
            return Self::released(row);
        }
        self.deliver(row).await
    }

    /// The completion of a row that was never sent.
    fn released(row: ClaimedRow) -> Finished {
        Finished {
            row_id: row.id,
            attempt: row.attempt,
            claim: row.claim,
            kind: row.kind,
            completion: Completion::Release,
            seconds: 0.0,
        }
    }

    /// One call for one row, and the completion to record, in an
    /// `outbox.dispatch` span continuing the event's trace (stored on the row
    /// by the ingest), so every attempt, hours apart or not, joins it.
    async fn deliver(&self, row: ClaimedRow) -> Finished {
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
        let _ = span.set_parent(service::traces::context_from_traceparent(
            row.trace_context.as_deref(),
        ));
        self.deliver_in_span(row).instrument(span).await
    }

    async fn deliver_in_span(&self, row: ClaimedRow) -> Finished {
        let started = Instant::now();
        let dispatch = match dispatch::prepare(&row, &self.endpoints) {
            Ok(prepared) => {
                dispatch::call(
                    &self.http,
                    &prepared,
                    &row.idempotency_key,
                    row.trace_context.as_deref(),
                )
                .await
            }
            Err(dispatch) => dispatch,
        };
        let completion = self.policy.complete(row.attempt, dispatch);
        let span = tracing::Span::current();
        match &completion {
            Completion::Done => span.record("outbox.outcome", "done"),
            Completion::Retry { error, .. } => {
                span.record("otel.status_code", "ERROR");
                tracing::info!(error, "call failed; will retry");
                span.record("outbox.outcome", "retry")
            }
            Completion::Dead { error } => {
                span.record("otel.status_code", "ERROR");
                tracing::warn!(error, "row is dead");
                span.record("outbox.outcome", "dead")
            }
            Completion::Release => span.record("outbox.outcome", "release"),
        };
        Finished {
            row_id: row.id,
            attempt: row.attempt,
            claim: row.claim,
            kind: row.kind,
            completion,
            seconds: started.elapsed().as_secs_f64(),
        }
    }

    /// Records outcomes (fenced on our lease) and the metrics of those recorded.
    async fn record(&self, finished: &[Finished]) -> anyhow::Result<()> {
        let outcomes: Vec<storage::Outcome> = finished
            .iter()
            .map(|f| storage::Outcome {
                id: f.row_id,
                claim: f.claim,
                completion: f.completion.clone(),
            })
            .collect();
        let client = self.pool.get().await?;
        let recorded = storage::record_outcomes(&client, &self.config.owner, &outcomes).await?;
        for f in finished {
            let label = match f.completion {
                Completion::Done => "done",
                Completion::Retry { .. } => "retry",
                Completion::Dead { .. } => "dead",
                Completion::Release => continue,
            };
            self.metrics.dispatched(&f.kind, label, f.seconds);
        }
        for r in &recorded {
            if r.status == "done" {
                self.metrics.enqueue_to_done.observe(r.age_seconds);
            }
        }
        if recorded.len() < outcomes.len() {
            tracing::warn!(
                lost = outcomes.len() - recorded.len(),
                "some rows were no longer ours (lease expired and taken): their outcome was not recorded"
            );
        }
        Ok(())
    }

    /// Runs until `shutdown`: claims, sends and records continuously.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let concurrency = self.config.concurrency as usize;
        let max_held = concurrency + self.config.batch_size as usize;
        let held = Arc::new(AtomicUsize::new(0));
        let calls = Arc::new(Semaphore::new(concurrency));
        let (done_tx, done_rx) = mpsc::unbounded_channel::<Finished>();
        let recorder = tokio::spawn(self.clone().recorder(done_rx, held.clone()));
        let mut claim_failures = 0u32;

        while !shutdown.is_cancelled() {
            let room = max_held.saturating_sub(held.load(Ordering::Acquire));
            if room == 0 {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = shutdown.cancelled() => break,
                }
                continue;
            }
            let want = room.min(self.config.batch_size as usize);
            let rows = match self.claim(want as i64).await {
                Ok(rows) => {
                    claim_failures = 0;
                    rows
                }
                Err(e) => {
                    claim_failures += 1;
                    if claim_failures == 1 || claim_failures.is_multiple_of(30) {
                        tracing::warn!(error = format!("{e:#}"), "claim failed; retrying");
                    }
                    let pause = Duration::from_millis(200 * u64::from(claim_failures.min(10)));
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = shutdown.cancelled() => break,
                    }
                    continue;
                }
            };
            let got = rows.len();
            held.fetch_add(got, Ordering::AcqRel);
            for row in rows {
                let relay = self.clone();
                let calls = calls.clone();
                let done = done_tx.clone();
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    let started = tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => None,
                        slot = calls.acquire_owned() => slot.ok(),
                    };
                    let finished = match started {
                        Some(_slot) => relay.send_or_release(row).await,
                        // Never sent: hand it back for another relay, at once.
                        None => Self::released(row),
                    };
                    let _ = done.send(finished);
                });
            }
            if got < want {
                // Drained: sleep until a NOTIFY, the poll tick, or shutdown.
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(self.config.poll_interval) => {}
                    _ = shutdown.cancelled() => break,
                }
            }
        }
        drop(done_tx);
        // Every spawned row task finishes (calls bounded by the HTTP timeout)
        // and the recorder flushes them all before returning.
        let _ = recorder.await;
    }

    /// Collects outcomes and records them in batches: whatever has arrived
    /// when the previous batch is written goes into the next one.
    async fn recorder(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<Finished>, held: Arc<AtomicUsize>) {
        let max = (self.config.batch_size as usize).max(1) * 2;
        let mut batch = Vec::with_capacity(max);
        while rx.recv_many(&mut batch, max).await > 0 {
            let n = batch.len();
            let mut attempt = 0u32;
            loop {
                // Outcomes are worth retrying hard: an unrecorded success is
                // sent again after the lease expires (harmless, the key holds,
                // but wasteful).
                match self.record(&batch).await {
                    Ok(()) => break,
                    Err(e) => {
                        attempt += 1;
                        if attempt >= 20 {
                            tracing::error!(
                                error = format!("{e:#}"),
                                rows = n,
                                "could not record outcomes; their leases will expire and they will be retried"
                            );
                            break;
                        }
                        tracing::warn!(error = format!("{e:#}"), "recording outcomes failed; retrying");
                        tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
                    }
                }
            }
            batch.clear();
            held.fetch_sub(n, Ordering::AcqRel);
            self.wake.notify_one();
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
