//! Waking the relays after commits.
//!
//! Each request that enqueued outbox rows calls [`Notifier::notify`] after
//! its transaction committed; one task sends a `NOTIFY` on
//! [`db::NOTIFY_CHANNEL`] ([`storage::wake_relays`]) on a pooled connection,
//! at most one at a time and at most one per [`NOTIFY_SPACING`]: every
//! commit made before a `NOTIFY` is sent is covered by it, so under load
//! thousands of commits a second cost at most 200 notifications, and when
//! idle each commit gets its own within a millisecond.
//!
//! Why not `NOTIFY` inside the enqueuing transaction: Postgres takes a global
//! lock for every notifying transaction and holds it through the commit's WAL
//! flush, so concurrent ingest transactions would commit one flush at a time
//! (see `storage` for the measurement). A crash between the commit and the
//! `NOTIFY` loses nothing: the rows are durable and the relays' polling
//! (`RELAY_POLL_INTERVAL_MS`) finds them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::storage;

/// The least time between two `NOTIFY`s. A relay that has drained its
/// backlog claims at most every 5 ms (its `CLAIM_SPACING`), so notifications
/// closer together only wake it, its listening backend and this ingest's
/// pooled backend for nothing; the first commit after a quiet spell is still
/// announced at once.
pub const NOTIFY_SPACING: Duration = Duration::from_millis(5);

#[derive(Debug, Default)]
pub struct Notifier {
    /// Commits not yet covered by a `NOTIFY`.
    pending: AtomicBool,
    wake: Notify,
}

impl Notifier {
    /// Called after a commit that enqueued rows.
    pub fn notify(&self) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            self.wake.notify_one();
        }
    }

    /// Sends the notifications until `stop`.
    pub async fn run(&self, pool: db::Pool, stop: CancellationToken) {
        let mut last: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = stop.cancelled() => return,
            }
            if let Some(last) = last {
                tokio::select! {
                    _ = tokio::time::sleep_until(last + NOTIFY_SPACING) => {}
                    _ = stop.cancelled() => return,
                }
            }
            last = Some(Instant::now());
            // Cleared before sending: a commit during the send sets it again
            // and gets a NOTIFY of its own right after.
            self.pending.store(false, Ordering::Release);
            let sent = async {
                let client = pool.get().await.map_err(|e| e.to_string())?;
                storage::wake_relays(&client).await.map_err(|e| e.to_string())
            }
            .await;
            if let Err(e) = sent {
                tracing::debug!(error = e, "NOTIFY failed; the relays will poll");
            }
        }
    }
}
