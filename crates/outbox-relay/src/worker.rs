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
//! - A panic while sending a row is contained to that row: it is recorded as
//!   a failed attempt (retried after a backoff, dead when its attempts are
//!   used up), so its room is freed like any other's.
//! - One log line per finished call (done, retry or dead; none for a row
//!   released unsent), inside the row's `outbox.dispatch` span so that it
//!   carries the event's `event_id`, `trace_id` and `span_id` (README, Tracing one event).
//!
//! [`Relay::relay_once`] runs one claim-send-record cycle to completion, for
//! tests and tools that want to drain deterministically.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use domain::CommandKind;
use futures_util::FutureExt as _;
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::config::RelayConfig;
use crate::dispatch::{self, Called, Dispatch, Endpoints, RetryPolicy};
use crate::metrics::RelayMetrics;
use crate::storage::{self, ClaimedRow, Completion};

/// How long a claimed shipment may wait for a call slot and still be sent
/// without asking the database whether a refund cancelled it meanwhile.
/// Rows wait for a slot when the calls are saturated: with a fast downstream
/// for a few milliseconds (a look-up per row would cost more than the call:
/// measured, the drain rate fell by a third), with a slow one for seconds,
/// where a refund can land in the wait and the look-up costs nothing beside
/// the calls. So "under way" means: claimed, and sent within this long or
/// checked first.
const RECHECK_AFTER: Duration = Duration::from_millis(50);

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
        self.relay_once_with(|row| self.send_or_release(row)).await
    }

    /// [`Relay::relay_once`] with `work` doing each row's part (in production
    /// [`Relay::send_or_release`]; tests pass one that panics).
    async fn relay_once_with<W, F>(&self, work: W) -> anyhow::Result<Outcome>
    where
        W: Fn(ClaimedRow) -> F,
        F: Future<Output = Finished>,
    {
        let rows = self.claim(self.config.batch_size as i64).await?;
        if rows.is_empty() {
            return Ok(Outcome::Empty);
        }
        let n = rows.len();
        let calls = Arc::new(Semaphore::new(self.config.concurrency as usize));
        let work = &work;
        let finished = futures_util::future::join_all(rows.into_iter().map(|row| {
            let calls = calls.clone();
            async move {
                let waiting = Instant::now();
                let _slot = calls.acquire().await.expect("never closed");
                if waiting.elapsed() > RECHECK_AFTER && self.cancelled_while_waiting(&row).await {
                    return Self::released(row);
                }
                self.contain(row, work).await
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

    /// Whether a shipment that waited for a call slot after its claim (longer
    /// than [`RECHECK_AFTER`]) was cancelled meanwhile (its order refunded).
    /// It was not yet under way, so it must not be sent: the release records
    /// nothing but the lease's end. Only shipments can be cancelled. If the
    /// database cannot say, the row is not sent either.
    async fn cancelled_while_waiting(&self, row: &ClaimedRow) -> bool {
        if CommandKind::parse(&row.kind) != Some(CommandKind::ShipOrder) {
            return false;
        }
        let still_pending = match self.pool.get().await {
            Ok(client) => storage::still_pending(&client, row, &self.config.owner).await,
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
    async fn send_or_release(&self, row: ClaimedRow) -> Finished {
        // The call must end (at worst by its timeout) while the lease holds;
        // recording a moment after is fenced on the claim's attempt anyway.
        if Instant::now() + self.config.http_timeout >= row.lease_expires {
            tracing::debug!(outbox_id = row.id, "lease too short to send; released");
            return Self::released(row);
        }
        self.deliver(row).await
    }

    /// Runs one row's `work`, containing a panic in it.
    ///
    /// Uncontained, a panic ends the row's task before it hands a `Finished`
    /// to the recorder: the row's room among the held rows is never given
    /// back (enough such rows and the relay stops claiming) and the row waits
    /// out its lease. Contained, it is a failed attempt like a 503: retried
    /// after a backoff, dead once `RELAY_MAX_ATTEMPTS` are used up.
    async fn contain<F>(&self, row: ClaimedRow, work: impl FnOnce(ClaimedRow) -> F) -> Finished
    where
        F: Future<Output = Finished>,
    {
        let (row_id, attempt, claim) = (row.id, row.attempt, row.claim);
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
            Ok(finished) => return finished,
            Err(panic) => panic,
        };
        let error = format!(
            "relay panicked while dispatching: {}",
            panic_message(panic.as_ref())
        );
        let completion = self.policy.complete(
            attempt,
            Dispatch::Retry {
                after: None,
                error: error.clone(),
            },
        );
        tracing::error!(
            outbox_id = row_id,
            event_id,
            kind,
            attempt,
            outcome = completion_label(&completion),
            error,
            "relay panicked while dispatching; recorded as a failed attempt"
        );
        Finished {
            row_id,
            claim,
            kind,
            completion,
            seconds: started.elapsed().as_secs_f64(),
        }
    }

    /// The completion of a row that was never sent.
    fn released(row: ClaimedRow) -> Finished {
        Finished {
            row_id: row.id,
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
        let _ = span.set_parent(process::traces::context_from_traceparent(
            row.trace_context.as_deref(),
        ));
        self.deliver_in_span(row).instrument(span).await
    }

    /// The call, then its one log line (README, Tracing one event): `outcome`,
    /// `http_status` (absent when no answer came: a timeout, a connection
    /// error, a payload never sent), `duration_ms`, and for a failure the
    /// `error`; the span lifts `event_id`, `outbox_id`, `kind`, `attempt`,
    /// `idempotency_key`, `trace_id` and `span_id` onto it. Done and retry
    /// are `info` and dead is `warn`, so the default level (`RUST_LOG`
    /// unset) tells every call's story.
    async fn deliver_in_span(&self, row: ClaimedRow) -> Finished {
        let started = Instant::now();
        let Called { dispatch, status } = match dispatch::prepare(&row, &self.endpoints) {
            Ok(prepared) => {
                dispatch::call(
                    &self.http,
                    &prepared,
                    &row.idempotency_key,
                    row.trace_context.as_deref(),
                )
                .await
            }
            Err(dispatch) => Called {
                dispatch,
                status: None,
            },
        };
        let completion = self.policy.complete(row.attempt, dispatch);
        let elapsed = started.elapsed();
        // Whole microseconds, in milliseconds.
        let duration_ms = elapsed.as_micros() as f64 / 1000.0;
        let span = tracing::Span::current();
        span.record("outbox.outcome", completion_label(&completion));
        match &completion {
            Completion::Done => {
                tracing::info!(
                    outcome = "done",
                    http_status = status,
                    duration_ms,
                    "downstream call finished"
                );
            }
            Completion::Retry { delay, error } => {
                span.record("otel.status_code", "ERROR");
                tracing::info!(
                    outcome = "retry",
                    http_status = status,
                    duration_ms,
                    retry_in_ms = delay.as_millis() as u64,
                    error,
                    "downstream call finished"
                );
            }
            Completion::Dead { error } => {
                span.record("otel.status_code", "ERROR");
                tracing::warn!(
                    outcome = "dead",
                    http_status = status,
                    duration_ms,
                    error,
                    "downstream call finished"
                );
            }
            // Not an outcome of a call: the policy never makes it.
            Completion::Release => {}
        }
        Finished {
            row_id: row.id,
            claim: row.claim,
            kind: row.kind,
            completion,
            seconds: elapsed.as_secs_f64(),
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
        // Only what was recorded counts: a stale claim's outcome (the row
        // was claimed again meanwhile) is dropped, and not counted either.
        let recorded_ids: std::collections::HashSet<i64> = recorded.iter().map(|r| r.id).collect();
        for f in finished {
            if f.completion != Completion::Release && recorded_ids.contains(&f.row_id) {
                self.metrics
                    .dispatched(&f.kind, completion_label(&f.completion), f.seconds);
            }
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
        self.run_with(
            shutdown,
            |relay, row| async move { relay.send_or_release(row).await },
        )
        .await;
    }

    /// [`Relay::run`] with `work` doing each row's part (in production
    /// [`Relay::send_or_release`]; tests pass one that panics).
    async fn run_with<W, F>(self: Arc<Self>, shutdown: CancellationToken, work: W)
    where
        W: Fn(Arc<Self>, ClaimedRow) -> F + Clone + Send + 'static,
        F: Future<Output = Finished> + Send + 'static,
    {
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
                let work = work.clone();
                tokio::spawn(async move {
                    let waiting = Instant::now();
                    let started = tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => None,
                        slot = calls.acquire_owned() => slot.ok(),
                    };
                    let waited = waiting.elapsed() > RECHECK_AFTER;
                    // Exactly one `Finished` per held row, whatever happens
                    // in the send: the recorder gives the room back on it.
                    let finished = match started {
                        Some(_slot) if waited && relay.cancelled_while_waiting(&row).await => {
                            Self::released(row)
                        }
                        Some(_slot) => {
                            let sender = relay.clone();
                            relay.contain(row, move |row| work(sender, row)).await
                        }
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

/// The metric label and log `outcome` of a completion.
fn completion_label(completion: &Completion) -> &'static str {
    match completion {
        Completion::Done => "done",
        Completion::Retry { .. } => "retry",
        Completion::Dead { .. } => "dead",
        Completion::Release => "release",
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

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    //! A panic while sending, contained: driven through the real loop and
    //! the real `relay_once`, against Postgres and the simulated downstream,
    //! with a row's work that panics in place of [`Relay::send_or_release`].

    use std::sync::atomic::AtomicUsize;

    use clap::Parser as _;

    use super::*;
    use crate::metrics::DispatchLabels;

    struct Env {
        _db: testkit::TestDb,
        client: tokio_postgres::Client,
        downstream: simulator::downstream::RunningDownstream,
        relay: Arc<Relay>,
    }

    /// A fresh database with `rows` due shipments and a relay (logging in as
    /// the relay's role) with `flags` on top of this environment's.
    async fn env(rows: i64, flags: &[&str]) -> Env {
        let db = testkit::TestDb::new().await;
        let client = db.client().await;
        client
            .execute(
                "INSERT INTO outbox (kind, payload, idempotency_key, event_id, order_id)
                 SELECT 'ship_order', jsonb_build_object('v', 1, 'order_id', o, 'event_id', 'evt_' || o),
                        'ship-' || o, 'evt_' || o, o
                   FROM generate_series(1, $1::int8) AS o",
                &[&rows],
            )
            .await
            .unwrap();
        let downstream = simulator::downstream::spawn(Default::default()).await.unwrap();
        let (database_url, url) = (db.url_as(testkit::Role::Relay), downstream.url());
        let mut args = vec![
            "outbox-relay",
            "--database-url",
            &database_url,
            "--fulfilment-url",
            &url,
            "--email-url",
            &url,
        ];
        args.extend_from_slice(flags);
        let settings = crate::config::Cli::try_parse_from(args).unwrap().settings;
        let pool = settings.database().unwrap().pool(&db::ConnectOptions {
            application_name: "outbox-relay-unit-test",
            statement_timeout: None,
            abort_when_client_leaves: false,
            asynchronous_commit: true,
            pool_size: 4,
            pool_wait: Duration::from_secs(5),
        });
        let metrics = RelayMetrics::register(&mut prometheus_client::registry::Registry::default());
        let relay = Relay::new(pool, settings.relay().unwrap(), metrics).unwrap();
        Env {
            _db: db,
            client,
            downstream,
            relay: Arc::new(relay),
        }
    }

    impl Env {
        async fn count(&self, sql: &str) -> i64 {
            testkit::count(&self.client, sql).await
        }

        fn retries_counted(&self) -> u64 {
            self.relay
                .metrics
                .dispatches
                .get_or_create(&DispatchLabels {
                    kind: "ship_order",
                    outcome: "retry",
                })
                .get()
        }
    }

    /// The first `n` sends panic; the rest are real.
    fn panicking_first(
        n: usize,
    ) -> (
        Arc<AtomicUsize>,
        impl Fn(Arc<Relay>, ClaimedRow) -> futures_util::future::BoxFuture<'static, Finished>
        + Clone
        + Send
        + 'static,
    ) {
        let panics = Arc::new(AtomicUsize::new(0));
        let counted = panics.clone();
        let work = move |relay: Arc<Relay>, row: ClaimedRow| {
            let counted = counted.clone();
            async move {
                if counted.fetch_add(1, Ordering::SeqCst) < n {
                    panic!("injected fault for row {}", row.id);
                }
                relay.send_or_release(row).await
            }
            .boxed()
        };
        (panics, work)
    }

    /// One call slot and one batch: the loop holds at most two rows, so two
    /// panics that never gave their room back would stop it claiming.
    #[tokio::test]
    async fn the_loop_keeps_claiming_after_sends_panic() {
        let env = env(
            6,
            &[
                "--relay-concurrency",
                "1",
                "--relay-batch-size",
                "1",
                "--relay-poll-interval-ms",
                "50",
                "--relay-backoff-base-ms",
                "10",
                "--relay-backoff-max-secs",
                "1",
            ],
        )
        .await;
        let (_, work) = panicking_first(3);
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(env.relay.clone().run_with(shutdown.clone(), work));

        testkit::wait_for_count(
            &env.client,
            "SELECT count(*) FROM outbox WHERE status = 'done'",
            6,
            Duration::from_secs(20),
        )
        .await;
        // The three panicked attempts were recorded as failed attempts and
        // retried: nine attempts for six rows, six calls at the downstream.
        assert_eq!(env.count("SELECT sum(attempts)::int8 FROM outbox").await, 9);
        assert_eq!(env.downstream.stats().requests, 6);
        assert_eq!(env.retries_counted(), 3);
        // Every held row reached the recorder: the loop stops cleanly.
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(20), running)
            .await
            .expect("the loop stops once everything it held is recorded")
            .unwrap();
        assert_eq!(
            env.count("SELECT count(*) FROM outbox WHERE lease_owner IS NOT NULL")
                .await,
            0
        );
    }

    #[tokio::test]
    async fn relay_once_records_a_panicked_row_as_a_retry_and_the_rest_as_sent() {
        let env = env(3, &["--relay-backoff-base-ms", "60000"]).await;
        let (panics, work) = panicking_first(1);
        let outcome = env
            .relay
            .relay_once_with(|row| work(env.relay.clone(), row))
            .await
            .unwrap();
        assert_eq!(outcome, Outcome::Relayed(3));
        assert_eq!(panics.load(Ordering::SeqCst), 3);
        let rows = env
            .client
            .query(
                "SELECT status, attempts, last_error, lease_owner IS NULL AS released,
                        available_at > now() AS backed_off
                   FROM outbox ORDER BY status",
                &[],
            )
            .await
            .unwrap();
        let statuses: Vec<String> = rows.iter().map(|r| r.get("status")).collect();
        assert_eq!(statuses, ["done", "done", "pending"]);
        let panicked = &rows[2];
        assert_eq!(panicked.get::<_, i32>("attempts"), 1);
        let error: String = panicked.get("last_error");
        assert!(
            error.starts_with("relay panicked while dispatching: injected fault for row "),
            "{error}"
        );
        assert!(panicked.get::<_, bool>("released"), "no longer leased");
        assert!(panicked.get::<_, bool>("backed_off"), "retried after a backoff");
        assert_eq!(env.downstream.stats().requests, 2);
    }

    #[tokio::test]
    async fn a_panic_on_the_last_allowed_attempt_is_dead() {
        let env = env(1, &["--relay-max-attempts", "1"]).await;
        let (_, work) = panicking_first(1);
        env.relay
            .relay_once_with(|row| work(env.relay.clone(), row))
            .await
            .unwrap();
        let row = env
            .client
            .query_one("SELECT status, last_error FROM outbox", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>("status"), "dead");
        let error: String = row.get("last_error");
        assert!(
            error.contains("1 attempts") && error.contains("relay panicked while dispatching"),
            "{error}"
        );
    }
}
