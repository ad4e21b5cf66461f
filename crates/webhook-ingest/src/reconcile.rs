//! Payments that arrive before their orders, applied by themselves.
//!
//! A provider's webhook often arrives before the shop's checkout has
//! committed the order it pays. It is answered `unmatched` and recorded with
//! its payload; the provider got a 200 and will not send it again, so that
//! row is the only copy of money received. The reconciler applies it once an
//! order has its payment id, as the event would have applied had the order
//! been there: it runs the operator's `events replay` statement
//! (`storage/replay_event.sql`), which locks the event's row and changes it
//! only while it is still `unmatched`, and locks the order as every event
//! does. So it applies each event at most once however many reconcilers
//! (one per ingest replica), replays and redeliveries race it, in the
//! order's commit order like any delivery.
//!
//! How soon:
//! - every [`YOUNG_EVERY`], the events first delivered in the last
//!   [`YOUNG`]: the usual case, a checkout that commits a few seconds after
//!   the payment's webhook, is applied within about a second;
//! - every [`ALL_EVERY`], every event up to the provider's retry horizon
//!   (`UNMATCHED_HORIZON_HOURS`).
//!
//! Both walk the partial index of unmatched events from a point in time, so
//! a sweep costs the unmatched events in its window, never the table.
//! Past the horizon an event is left to an operator (`events replay`,
//! `events discard`): `webhook_unmatched_past_horizon_events` counts them
//! and an alert fires. Retention never deletes an unmatched event.

use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::metrics::IngestMetrics;
use crate::notifier::Notifier;
use crate::storage;

/// How recent an event is for the frequent sweep.
pub const YOUNG: Duration = Duration::from_secs(15 * 60);
/// How often the young events are looked at.
pub const YOUNG_EVERY: Duration = Duration::from_secs(1);
/// How often every event up to the horizon is looked at.
pub const ALL_EVERY: Duration = Duration::from_secs(60);
/// How often the unmatched gauges are refreshed.
pub const GAUGES_EVERY: Duration = Duration::from_secs(10);
/// Events applied per look-up; a sweep looks again while it finds a full one.
const BATCH: i64 = 200;
/// The most unmatched events past the horizon the gauge counts.
const PAST_HORIZON_CAP: i64 = 10_000;

/// Applies `unmatched` events whose order now exists; see the module.
#[derive(Clone)]
pub struct Reconciler {
    pool: db::Pool,
    notifier: std::sync::Arc<Notifier>,
    metrics: IngestMetrics,
    horizon: Duration,
}

impl Reconciler {
    pub fn new(
        pool: db::Pool,
        notifier: std::sync::Arc<Notifier>,
        metrics: IngestMetrics,
        horizon: Duration,
    ) -> Self {
        Self {
            pool,
            notifier,
            metrics,
            horizon,
        }
    }

    /// Sweeps until `stop`: the young events every [`YOUNG_EVERY`], all up
    /// to the horizon every [`ALL_EVERY`] (the first sweep is a full one),
    /// the gauges every [`GAUGES_EVERY`]. A failed sweep (the database away,
    /// a failover) is logged once per streak and tried again at the next tick.
    pub async fn run(&self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(YOUNG_EVERY);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut last_full: Option<Instant> = None;
        let mut last_gauges: Option<Instant> = None;
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.cancelled() => return,
            }
            let full = last_full.is_none_or(|t| t.elapsed() >= ALL_EVERY);
            let window = if full {
                self.horizon
            } else {
                YOUNG.min(self.horizon)
            };
            let mut result = self.sweep(window).await.map(drop);
            if result.is_ok() && full {
                last_full = Some(Instant::now());
            }
            if result.is_ok() && last_gauges.is_none_or(|t| t.elapsed() >= GAUGES_EVERY) {
                result = self.refresh_gauges().await;
                last_gauges = Some(Instant::now());
            }
            match result {
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(
                        error = %process::logs::error_chain(e.as_ref()),
                        "could not look for unmatched events whose order exists; trying again every second"
                    );
                }
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("looking for unmatched events whose order exists again");
                }
                _ => {}
            }
        }
    }

    /// Applies every `unmatched` event first delivered within `window` whose
    /// order exists now; returns how many this call applied (a racing
    /// reconciler or replay may have applied others).
    pub async fn sweep(&self, window: Duration) -> anyhow::Result<u64> {
        let client = self.pool.get().await?;
        let since = time::OffsetDateTime::now_utc() - window;
        let mut applied = 0;
        loop {
            let found = storage::matchable_events(&client, since, BATCH).await?;
            let mut applied_now = 0;
            for matchable in &found {
                let Some(event) = storage::stored_event(&matchable.event_id, matchable.payload.as_deref())
                else {
                    tracing::warn!(
                        event_id = %process::terminal::printable(&matchable.event_id),
                        "an unmatched event's stored payload does not parse: left for an operator"
                    );
                    continue;
                };
                let Some(replayed) = storage::replay_event(&client, &event).await? else {
                    // Applied meanwhile by another reconciler, a replay or
                    // a discard: nothing to do.
                    continue;
                };
                applied_now += 1;
                self.metrics.unmatched_applied.inc();
                if replayed.enqueued > 0 {
                    self.notifier.notify();
                }
                tracing::info!(
                    event_id = %process::terminal::printable(&event.id),
                    order_id = replayed.order_id,
                    outcome = replayed.status.as_str(),
                    enqueued = replayed.enqueued,
                    "applied an unmatched event: its order exists now"
                );
            }
            applied += applied_now;
            if found.len() < BATCH as usize || applied_now == 0 {
                return Ok(applied);
            }
        }
    }

    /// Reads the unmatched gauges: the oldest event's age, and how many are
    /// past the horizon.
    pub async fn refresh_gauges(&self) -> anyhow::Result<()> {
        let client = self.pool.get().await?;
        let now = time::OffsetDateTime::now_utc();
        let backlog = storage::unmatched_backlog(&client, now - self.horizon, PAST_HORIZON_CAP).await?;
        let age = backlog
            .oldest
            .map_or(0.0, |oldest| (now - oldest).as_seconds_f64().max(0.0));
        self.metrics.unmatched_oldest_age.set(age);
        self.metrics.unmatched_past_horizon.set(backlog.past_horizon);
        Ok(())
    }
}
