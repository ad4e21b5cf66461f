//! The relay loop.
//!
//! ```text
//!  claimer ──claim batch──▶ row tasks (≤ RELAY_CONCURRENCY calls in flight) ──verdict──▶ recorder
//!     ▲  wakes on NOTIFY, a poll tick, or room freed                                     │
//!     └──────────────────── room freed (calls ended; rows recorded) ◀────────────────────┘
//! ```
//!
//! - The claimer holds at most `RELAY_CONCURRENCY + RELAY_BATCH_SIZE` rows
//!   still to be sent: the calls in flight plus one batch waiting for a slot,
//!   so a slot never waits for a claim round trip, and no more rows are leased
//!   than can be sent well within their lease. It claims once half a batch of
//!   room is free (not for each call that ends), so each claim carries half a
//!   batch or more.
//! - Verdicts are recorded in batches by one recorder: one statement per batch
//!   instead of one per row, spaced by at least `RECORD_SPACING` on a busy
//!   relay so that each carries what arrived meanwhile. A row's room among
//!   those to send is freed when its call ends; every held row, recorded or
//!   not, is bounded too (`RELAY_CONCURRENCY + 5 * RELAY_BATCH_SIZE`).
//! - Shutdown: the claimer stops; rows not yet started are released (back to
//!   pending, due now, their attempt undone); calls in flight finish (each
//!   bounded by the HTTP timeout) and are recorded; then the loop returns.
//! - A panic while sending a row is contained to that row: it is recorded as
//!   a failed attempt (retried after a backoff, dead when its attempts are
//!   used up), so its room is freed like any other's.
//! - One log line per finished call (done, retry or dead; none for a row
//!   released unsent), inside the row's `outbox.dispatch` span so that it
//!   carries the event's `event_id`, `trace_id` and `span_id` (docs/CONTRACT.md, section 8).
//!
//! [`Relay::relay_once`] runs one claim-send-record pass to completion, for
//! tests and tools that want to drain deterministically.
//!
//! # Layout
//! - this file: [`Relay`], its one pass ([`Relay::relay_once`]) and its claim.
//! - `row`: one claimed row's part: the recheck of a shipment that waited, the
//!   lease check, the call and its log line, a panic contained.
//! - `run`: the endless loop ([`Relay::run`]): the claimer and the row tasks.
//! - `record`: the recorder: verdicts recorded in batches, and their metrics.
//!
//! Each statement the loop runs has a client span (`db::span`): the claim and
//! the recording of verdicts are roots of their own traces (their rows
//! belong to many events), the recheck of a waiting shipment is in its
//! event's trace.

mod record;
mod row;
mod run;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use db::span::Summary;
use tokio::sync::{Notify, Semaphore};

use crate::config::RelayConfig;
use crate::dispatch::Endpoints;
use crate::metrics::RelayMetrics;
use crate::policy::RetryPolicy;
use crate::storage::{self, ClaimedRow};

use row::{RECHECK_AFTER, Settled};

/// What the claim (`claim.sql`) does, as its client span names it.
const CLAIM_SUMMARY: Summary = Summary::on("SELECT public.outbox UPDATE public.outbox", "public.outbox");
/// What the recheck of a waiting shipment (`still_pending.sql`) does.
const STILL_PENDING_SUMMARY: Summary = Summary::single("SELECT public.outbox", "SELECT", "public.outbox");
/// What the recording of verdicts (`complete.sql`) does.
const RECORD_SUMMARY: Summary = Summary::single("UPDATE public.outbox", "UPDATE", "public.outbox");

/// What one pass ([`Relay::relay_once`]) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// This many rows were claimed, and each was sent (or released) and recorded.
    Relayed(usize),
    /// Nothing was due.
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
    /// Where the pool's statements go, as their client spans say it.
    span_server: db::span::Server,
    http: reqwest::Client,
    endpoints: Endpoints,
    policy: RetryPolicy,
    config: RelayConfig,
    metrics: RelayMetrics,
    /// Woken by NOTIFY (through the listener) and by freed room.
    wake: Arc<Notify>,
    pub health: Arc<LoopHealth>,
}

impl Relay {
    /// A relay running its statements on `pool`, whose connections go where
    /// `span_server` says ([`db::Database::span_server`]).
    pub fn new(
        pool: db::Pool,
        span_server: db::span::Server,
        config: RelayConfig,
        metrics: RelayMetrics,
    ) -> anyhow::Result<Self> {
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
            span_server,
            http,
            endpoints: Endpoints::new(&config.fulfilment, &config.email).map_err(anyhow::Error::msg)?,
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
    pub async fn relay_once(&self) -> anyhow::Result<Pass> {
        self.relay_once_with(|row| self.send_or_release(row)).await
    }

    /// [`Relay::relay_once`] with `work` doing each row's part (in production
    /// [`Relay::send_or_release`]; tests pass one that panics).
    async fn relay_once_with<W, F>(&self, work: W) -> anyhow::Result<Pass>
    where
        W: Fn(ClaimedRow) -> F,
        F: Future<Output = Settled>,
    {
        let rows = self.claim(self.config.batch_size as i64, None, true).await?;
        if rows.is_empty() {
            return Ok(Pass::Empty);
        }
        let n = rows.len();
        let calls = Arc::new(Semaphore::new(self.config.concurrency as usize));
        let work = &work;
        let settled = futures_util::future::join_all(rows.into_iter().map(|row| {
            let calls = calls.clone();
            async move {
                let waiting = Instant::now();
                let _slot = calls.acquire().await.expect("never closed");
                if waiting.elapsed() > RECHECK_AFTER && self.cancelled_while_waiting(&row).await {
                    return Settled::released(row);
                }
                self.contain(row, work).await
            }
        }))
        .await;
        self.record(&settled).await?;
        Ok(Pass::Relayed(n))
    }

    /// Claims up to `limit` rows due at `from` (Unix seconds) or later, or
    /// any due row for `None`; in a client span when `traced` (not at an idle
    /// relay's poll ticks).
    async fn claim(&self, limit: i64, from: Option<f64>, traced: bool) -> anyhow::Result<Vec<ClaimedRow>> {
        let client = self.pool.get().await?;
        let span = if traced {
            db::client_span!(parent: None, &self.span_server, CLAIM_SUMMARY)
        } else {
            tracing::Span::none()
        };
        let rows = storage::claim_due_batch(
            &client,
            limit,
            &self.config.owner,
            self.config.lease,
            self.config.max_attempts,
            from,
        )
        .await;
        match &rows {
            Ok(rows) => db::span::returned(&span, rows.len()),
            Err(e) => db::span::failed(&span, e),
        }
        drop(span);
        let rows = rows?;
        self.health.last_claim_ms.store(now_ms(), Ordering::Relaxed);
        Ok(rows)
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod summary_tests {
    use super::*;

    #[test]
    fn each_statement_has_a_span_summary_of_what_it_does() {
        for (summary, sql) in [
            (CLAIM_SUMMARY, &storage::claim::CLAIM),
            (STILL_PENDING_SUMMARY, &storage::claim::STILL_PENDING),
            (RECORD_SUMMARY, &storage::complete::COMPLETE),
        ] {
            assert_eq!(summary.describes(sql), Ok(()));
        }
    }
}
