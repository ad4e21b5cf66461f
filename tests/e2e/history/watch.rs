//! The progress lines a run prints, and the waits that print them.

use super::*;

/// The chaos of a soak run so far, for the progress line.
#[derive(Default)]
pub(super) struct ChaosSoFar {
    pub(super) relays_killed: AtomicU64,
    pub(super) ingests_killed: AtomicU64,
    pub(super) postgres_restarts: AtomicU64,
}

impl std::fmt::Display for ChaosSoFar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kills {} relay + {} ingest, Postgres restarts {}",
            self.relays_killed.load(Ordering::Relaxed),
            self.ingests_killed.load(Ordering::Relaxed),
            self.postgres_restarts.load(Ordering::Relaxed)
        )
    }
}

/// What a progress line reads besides the deliveries: the downstream's
/// effects and the chaos (in soak runs).
pub(super) struct Watched<'a> {
    pub(super) progress: &'a Mutex<Progress>,
    pub(super) downstream: &'a RunningDownstream,
    pub(super) chaos: Option<&'a ChaosSoFar>,
}

impl Watched<'_> {
    pub(super) fn note(&self, what: &str) {
        self.progress.lock().unwrap().note(what);
    }

    pub(super) fn line(&self, phase: &str, what: &str, count: u64, unit: &str) {
        let mut progress = self.progress.lock().unwrap();
        if !progress.due() {
            return;
        }
        let totals = self.downstream.totals();
        let chaos = self.chaos.map_or_else(String::new, |c| format!(" | {c}"));
        let what = format!(
            "{what} | effects {} (requests {}){chaos}",
            thousands(totals.effects),
            thousands(totals.requests)
        );
        progress.line(phase, &what, count, unit);
    }

    /// Runs `work` (a [`deliver_all`] of `phase`), with a progress
    /// line every few seconds: its deliveries sent and acknowledged of the
    /// `planned`.
    pub(super) async fn delivering(
        &self,
        phase: u8,
        planned: u64,
        log: &Mutex<Vec<Delivery>>,
        work: impl Future<Output = ()>,
    ) {
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                () = &mut work => return,
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
            let (sent, acknowledged) = log
                .lock()
                .unwrap()
                .iter()
                .filter(|d| d.phase == phase)
                .fold((0, 0), |(sent, acked), d| {
                    (sent + 1, acked + u64::from(d.status == 200))
                });
            self.line(
                &format!("phase {phase}, delivering"),
                &format!(
                    "deliveries sent {} (retries included), acknowledged {}/{}",
                    thousands(sent),
                    thousands(acknowledged),
                    thousands(planned)
                ),
                acknowledged,
                "deliveries",
            );
        }
    }

    /// Until every event whose order exists is applied and nothing is
    /// pending.
    pub(super) async fn until_drained(
        &self,
        client: &tokio_postgres::Client,
        after: &str,
        timeout: Duration,
    ) {
        let started = Instant::now();
        loop {
            let unapplied = testkit::count(client, UNAPPLIED).await;
            let left = testkit::count(client, "SELECT count(*) FROM outbox WHERE status = 'pending'").await;
            if left == 0 && unapplied == 0 {
                self.note(&format!(
                    "drained after {after} in {:.1} s",
                    started.elapsed().as_secs_f64()
                ));
                return;
            }
            assert!(
                started.elapsed() < timeout,
                "{left} rows still pending, {unapplied} unmatched events whose order exists"
            );
            self.line(
                &format!("draining after {after}"),
                &format!(
                    "{} outbox rows pending, {} unmatched events whose order exists",
                    thousands(left as u64),
                    thousands(unapplied as u64)
                ),
                self.downstream.totals().effects,
                "effects",
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Unmatched events whose order exists now: what the reconciler has yet to
/// apply.
pub(super) const UNAPPLIED: &str = "SELECT count(*) FROM processed_events pe
    JOIN orders o ON o.payment_id = pe.payload -> 'data' ->> 'payment_id'
    WHERE pe.status = 'unmatched'";
