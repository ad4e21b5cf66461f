//! Recording a verified delivery: the one room the ingest's database path
//! lives in. [`Recorder::record`] is its only door:
//!
//! - a payment's first try is queued and recorded with whatever other
//!   payments arrived while the statement before them ran ([`batch`], group
//!   commit); a refund's or an ignored type's runs alone;
//! - a try that finds the event's order locked waits with no connection and
//!   tries again, alone, until the deadline;
//! - a statement still running at the deadline is cancelled on the server,
//!   and the delivery is answered 503 ([`statement`]).
//!
//! Every bound comes from one value, `INGEST_DEADLINE_MS` ([`Deadline`]).
//! The files import downwards only: this one uses `batch`, `queue` and
//! `statement`; `batch` uses `queue` and `statement`; `statement` and
//! `deadline` use none of them.

mod batch;
mod deadline;
mod queue;
mod statement;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::timeout_at;
use tokio_postgres::error::SqlState;

pub use batch::LINGER;
pub use deadline::Deadline;
pub use queue::MAX_BATCH;
pub use statement::Received;

use self::batch::Batcher;
use self::queue::Answer;
use self::statement::Statements;
use crate::error::IngestError;
use crate::metrics::IngestMetrics;
use crate::notifier::Notifier;
use crate::storage::{self, Recorded};

/// Records verified deliveries (see the module's documentation).
pub struct Recorder {
    statements: Arc<Statements>,
    batcher: Arc<Batcher>,
    /// Connections that deliveries waiting for a locked order may hold at
    /// once, trying again ([`lock_retry_slots`]).
    lock_retries: tokio::sync::Semaphore,
}

impl Recorder {
    pub fn new(
        database: &db::Database,
        pool: db::Pool,
        notifier: Arc<Notifier>,
        metrics: IngestMetrics,
        deadline: Deadline,
    ) -> Self {
        let lock_retries = tokio::sync::Semaphore::new(lock_retry_slots(pool.status().max));
        let statements = Arc::new(Statements::new(database, pool, notifier, metrics, deadline));
        Self {
            batcher: Arc::new(Batcher::new(statements.clone())),
            statements,
            lock_retries,
        }
    }

    /// Records `received` in the current (request) span.
    ///
    /// A try that finds the event's order locked for longer than the
    /// session's `lock_timeout` (by the shop, or by a slow delivery) fails
    /// with `lock_not_available` and changes nothing; the delivery then
    /// waits, holding no connection, and tries again until its deadline (a
    /// 503 then, which the provider retries). Tries after the first take one
    /// of the few `lock_retries` slots first, so however many deliveries
    /// wait for one order's lock, most of the pool stays free for every
    /// other order.
    pub async fn record(&self, received: &Received) -> Result<Recorded, IngestError> {
        let deadline = received.deadline;
        let mut first = None;
        if storage::batchable(&received.event) {
            match self.batcher.enqueue(received).await? {
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
                let slot = timeout_at(deadline, self.lock_retries.acquire())
                    .await
                    .map_err(|_| IngestError::Deadline)?
                    .map_err(|e| IngestError::Unexpected(e.into()))?;
                Some(slot)
            };
            let answer = match first.take() {
                Some(answer) => answer,
                None => self.alone(received).await?,
            };
            match answer {
                Ok(recorded) => {
                    if recorded.enqueued() > 0 {
                        self.statements.notify();
                    }
                    return Ok(recorded);
                }
                Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                    self.statements.metrics.lock_waits.inc();
                    if tries == 1 {
                        tracing::info!(
                            "the order is locked; waiting without a connection, then trying again"
                        );
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

    /// One try of the delivery's own statement on a pooled connection.
    async fn alone(
        &self,
        received: &Received,
    ) -> Result<Result<Recorded, tokio_postgres::Error>, IngestError> {
        let client = timeout_at(received.deadline, self.statements.pool.get())
            .await
            .map_err(|_| IngestError::Deadline)?
            .map_err(|e| IngestError::Unavailable(process::logs::error_chain(&e)))?;
        let span = self
            .statements
            .alone_span(&tracing::Span::current(), &received.event);
        self.statements
            .alone(client, received, &span)
            .await
            .ok_or(IngestError::Deadline)
    }
}

/// How many of the pool's connections deliveries waiting for a locked order
/// may hold at once, trying again: a quarter (at least one). The rest stay
/// for every other order's deliveries, however many wait for one lock.
fn lock_retry_slots(pool_size: usize) -> usize {
    (pool_size / 4).max(1)
}

/// The pause before try `tries + 1` for a locked order: 10 ms, doubling up
/// to 160 ms, with full jitter (so the waiters of one lock spread out).
fn lock_backoff(tries: u32) -> Duration {
    let ceiling = Duration::from_millis(10) * 2u32.pow(tries.saturating_sub(1).min(4));
    ceiling.mul_f64(rand::random::<f64>().max(0.1))
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

    #[test]
    fn a_quarter_of_the_pool_may_retry_locked_orders_and_never_none() {
        assert_eq!(lock_retry_slots(16), 4);
        assert_eq!(lock_retry_slots(4), 1);
        assert_eq!(lock_retry_slots(1), 1);
        assert_eq!(lock_retry_slots(2), 1);
        assert_eq!(lock_retry_slots(100), 25);
    }
}
