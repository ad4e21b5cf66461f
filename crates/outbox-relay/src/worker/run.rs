//! The endless loop: the claimer keeps the held rows topped up, a task per
//! row waits for a call slot and sends it, and the recorder (`record`)
//! records what they settle and frees their room.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::Relay;
use super::row::{RECHECK_AFTER, Settled};
use crate::storage::ClaimedRow;

/// The least time between two claims of a drained relay: what a row
/// committed into a busy stream may wait, at most, for its claim to carry
/// the rows committed around it (at 2,000 rows/s, ten per claim rather than
/// one or two).
const CLAIM_SPACING: Duration = Duration::from_millis(5);

/// How far before the earliest row of the last claim the next claim starts
/// looking (see [`ClaimFloor`]): more than any writer of outbox rows takes
/// from its statement's start to its commit, bar the rare late one.
const FLOOR_MARGIN_SECS: f64 = 1.0;

/// Where the next claim starts in the due index. Every completed row leaves
/// a dead entry at the index's old end until a VACUUM (autovacuum may be a
/// minute or more away); a claim from the start walks through all of them,
/// so under a steady stream or a big drain each claim would cost more than
/// the last (5 ms for 150,000 entries here). Most claims therefore start
/// [`FLOOR_MARGIN_SECS`] before the earliest row the last claim took; one
/// per `RELAY_POLL_INTERVAL_MS` starts from the beginning, and finds what a
/// floor leaves behind (a row committed late, a lease that expired, a row
/// released unsent), so no row waits more than that interval longer.
struct ClaimFloor {
    from: Option<f64>,
    last_full: Instant,
    every: Duration,
}

impl ClaimFloor {
    fn new(every: Duration) -> Self {
        Self {
            from: None,
            last_full: Instant::now(),
            every,
        }
    }

    /// Where this claim starts: `None` for a claim from the beginning.
    fn next(&mut self, now: Instant) -> Option<f64> {
        if now.duration_since(self.last_full) >= self.every {
            self.from = None;
        }
        if self.from.is_none() {
            self.last_full = now;
        }
        self.from
    }

    /// After a claim that took rows due at `due` (Unix seconds): the floor
    /// rises to just before the earliest of them (and never falls between
    /// claims from the beginning).
    fn taken(&mut self, due: impl Iterator<Item = f64>) {
        if let Some(earliest) = due.reduce(f64::min) {
            let floor = earliest - FLOOR_MARGIN_SECS;
            self.from = Some(self.from.map_or(floor, |f| f.max(floor)));
        }
    }
}

impl Relay {
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
    pub(super) async fn run_with<W, F>(self: Arc<Self>, shutdown: CancellationToken, work: W)
    where
        W: Fn(Arc<Self>, ClaimedRow) -> F + Clone + Send + 'static,
        F: Future<Output = Settled> + Send + 'static,
    {
        let concurrency = self.config.concurrency as usize;
        let batch = self.config.batch_size as usize;
        // Rows still to be sent (waiting for a slot or in a call): what the
        // lease must cover, so bounded as before.
        let max_sending = concurrency + batch;
        // Every held row, its verdict not yet recorded too: a backstop in
        // case the recorder falls behind.
        let max_held = max_sending + 4 * batch;
        // Claim once this much room is free (or nothing else is held), so
        // that claims carry about half a batch or more rather than the
        // handful of rows one call's end frees.
        let low_water = (batch / 2).max(1);
        let sending = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(AtomicUsize::new(0));
        let calls = Arc::new(Semaphore::new(concurrency));
        let (settled_tx, settled_rx) = mpsc::unbounded_channel::<Settled>();
        let recorder = tokio::spawn(self.clone().recorder(settled_rx, held.clone()));
        let mut claim_failures = 0u32;
        let mut floor = ClaimFloor::new(self.config.poll_interval);
        // The claim after an empty claim and a quiet poll interval (no
        // NOTIFY) has no span: an idle relay would otherwise send a trace
        // per poll. A claim that finds rows at such a tick is counted in
        // the metrics and its rows are in their events' traces.
        let mut idle_tick = false;

        while !shutdown.is_cancelled() {
            let room = max_sending
                .saturating_sub(sending.load(Ordering::Acquire))
                .min(max_held.saturating_sub(held.load(Ordering::Acquire)));
            if room == 0 || (room < low_water && sending.load(Ordering::Acquire) > 0) {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = shutdown.cancelled() => break,
                }
                continue;
            }
            let want = room.min(self.config.batch_size as usize);
            let claimed_at = Instant::now();
            let rows = match self.claim(want as i64, floor.next(claimed_at), !idle_tick).await {
                Ok(rows) => {
                    claim_failures = 0;
                    floor.taken(rows.iter().map(|r| r.due_at));
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
            sending.fetch_add(got, Ordering::AcqRel);
            for row in rows {
                let relay = self.clone();
                let sending = sending.clone();
                let calls = calls.clone();
                let settled_tx = settled_tx.clone();
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
                    // Exactly one `Settled` per held row, whatever happens
                    // in the send: the recorder gives the room back on it.
                    let settled = match started {
                        Some(_slot) if waited && relay.cancelled_while_waiting(&row).await => {
                            Settled::released(row)
                        }
                        Some(_slot) => {
                            let sender = relay.clone();
                            relay.contain(row, move |row| work(sender, row)).await
                        }
                        // Never sent: hand it back for another relay, at once.
                        None => Settled::released(row),
                    };
                    let _ = settled_tx.send(settled);
                    // Its room among the rows to send is free now (its
                    // verdict is the recorder's); the claimer is woken when
                    // the room reaches the low-water mark, not per row.
                    let before = sending.fetch_sub(1, Ordering::AcqRel);
                    if before + low_water == max_sending + 1 || before == 1 {
                        relay.wake.notify_one();
                    }
                });
            }
            if got == want {
                idle_tick = false;
            }
            if got < want {
                // Drained: sleep until a NOTIFY, the poll tick, or shutdown.
                idle_tick = tokio::select! {
                    _ = self.wake.notified() => false,
                    _ = tokio::time::sleep(self.config.poll_interval) => got == 0,
                    _ = shutdown.cancelled() => break,
                };
                // Under a steady stream of commits, each NOTIFY would start a
                // claim for the row or two committed since the last one: the
                // claims (and their completions) are spaced instead, so each
                // carries what arrived meanwhile. An event on a quiet relay
                // is claimed at once.
                let spaced = claimed_at + CLAIM_SPACING;
                if Instant::now() < spaced {
                    tokio::select! {
                        _ = tokio::time::sleep_until(spaced.into()) => {}
                        _ = shutdown.cancelled() => break,
                    }
                }
            }
        }
        drop(settled_tx);
        // Every spawned row task finishes (calls bounded by the HTTP timeout)
        // and the recorder flushes them all before returning.
        let _ = recorder.await;
    }
}

#[cfg(test)]
mod floor_tests {
    use super::*;

    #[test]
    fn claims_start_a_second_before_the_last_claims_earliest_row_and_from_the_start_once_per_interval() {
        let every = Duration::from_secs(1);
        let t0 = Instant::now();
        let mut floor = ClaimFloor::new(every);
        floor.last_full = t0;
        assert_eq!(floor.next(t0), None, "the first claim is from the start");
        floor.taken([105.0, 100.0, 101.5].into_iter());
        assert_eq!(floor.next(t0 + Duration::from_millis(5)), Some(99.0));
        floor.taken(std::iter::empty());
        assert_eq!(
            floor.next(t0 + Duration::from_millis(10)),
            Some(99.0),
            "an empty claim keeps it"
        );
        floor.taken([50.0].into_iter());
        assert_eq!(
            floor.next(t0 + Duration::from_millis(15)),
            Some(99.0),
            "it never falls"
        );
        floor.taken([200.0].into_iter());
        assert_eq!(floor.next(t0 + Duration::from_millis(20)), Some(199.0));
        assert_eq!(floor.next(t0 + every), None, "once per interval from the start");
        floor.taken([60.0].into_iter());
        assert_eq!(
            floor.next(t0 + every + Duration::from_millis(5)),
            Some(59.0),
            "and from what that found"
        );
        assert_eq!(floor.next(t0 + every * 2 - Duration::from_millis(1)), Some(59.0));
        assert_eq!(floor.next(t0 + every * 2), None);
    }
}
