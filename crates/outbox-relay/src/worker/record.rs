//! The recorder: verdicts recorded in batches (one statement for whatever
//! has arrived), fenced on each row's claim, and counted in the metrics once
//! recorded.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The least time between two recording statements of a busy relay.
const RECORD_SPACING: Duration = Duration::from_millis(5);

use domain::OutboxStatus;
use tokio::sync::mpsc;

use super::Relay;
use super::row::Settled;

use crate::storage::{self, RowVerdict, Verdict};

impl Relay {
    /// Records verdicts (fenced on our lease) and the metrics of those recorded.
    pub(super) async fn record(&self, settled: &[Settled]) -> anyhow::Result<()> {
        if settled.is_empty() {
            // No statement, so no span saying one ran.
            return Ok(());
        }
        let verdicts: Vec<RowVerdict> = settled.iter().map(|s| s.row.clone()).collect();
        let client = self.pool.get().await?;
        let span = db::client_span!(parent: None, &self.span_server, super::RECORD_SUMMARY);
        let recorded = storage::record_verdicts(&client, &self.config.owner, &verdicts).await;
        match &recorded {
            Ok(recorded) => db::span::returned(&span, recorded.len()),
            Err(e) => db::span::failed(&span, e),
        }
        drop(span);
        let recorded = recorded?;
        // Only what was recorded counts: a stale claim's verdict (the row
        // was claimed again meanwhile) is dropped, and not counted either.
        let recorded_ids: HashSet<i64> = recorded.iter().map(|r| r.id).collect();
        for s in settled {
            if s.row.verdict != Verdict::Release && recorded_ids.contains(&s.row.id) {
                self.metrics.dispatched(&s.kind, &s.row.verdict, s.seconds);
            }
        }
        for r in &recorded {
            if r.status == OutboxStatus::Done {
                self.metrics.enqueue_to_done.observe(r.age_seconds);
            }
        }
        if recorded.len() < verdicts.len() {
            tracing::warn!(
                lost = verdicts.len() - recorded.len(),
                "some rows were no longer ours (lease expired and taken): their outcome was not recorded"
            );
        }
        Ok(())
    }

    /// Collects settled rows and records them in batches: whatever has
    /// arrived when the previous batch is written goes into the next one.
    pub(super) async fn recorder(
        self: Arc<Self>,
        mut rx: mpsc::UnboundedReceiver<Settled>,
        held: Arc<AtomicUsize>,
    ) {
        let max = (self.config.batch_size as usize).max(1) * 2;
        let mut batch = Vec::with_capacity(max);
        let mut last = Instant::now() - RECORD_SPACING;
        while rx.recv_many(&mut batch, max).await > 0 {
            // Under load, verdicts arrive one by one as calls end: the
            // statements are spaced (like the claims) so that each records
            // what arrived meanwhile, up to `max`; on a quiet relay the
            // previous statement is long past and this one runs at once.
            let until = last + RECORD_SPACING;
            while batch.len() < max {
                let now = Instant::now();
                if now >= until {
                    break;
                }
                let left = max - batch.len();
                match tokio::time::timeout(until - now, rx.recv_many(&mut batch, left)).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            last = Instant::now();
            let n = batch.len();
            let mut attempt = 0u32;
            loop {
                // Verdicts are worth retrying hard: an unrecorded success is
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
