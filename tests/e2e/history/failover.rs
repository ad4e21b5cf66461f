//! The primary's death on a Patroni cluster, and what the evidence shows
//! of it afterwards.

use super::*;

/// How far behind the primary its standby is when the primary dies: its WAL
/// senders are stopped this long first (testkit's
/// `kill_primary_with_standby_behind`), as a busy network or a slow standby
/// leaves an asynchronous one. A synchronous standby is never behind what
/// was acknowledged: those commits wait, and get no 200.
pub(super) const STANDBY_BEHIND: Duration = Duration::from_millis(300);

/// What a failover did, measured.
#[derive(Debug, Clone)]
pub(crate) struct Failover {
    pub killed: testkit::HaNode,
    pub promoted: testkit::HaNode,
    /// From the SIGKILL until Patroni reported the new primary.
    pub promoted_after: Duration,
    /// The longest time with no 200 at the provider around the kill.
    pub no_200_window: Duration,
    /// From the kill to the first outbox claim on the new primary, and to
    /// the first downstream call the relays made after it.
    pub first_claim_after: Option<Duration>,
    pub first_call_after: Option<Duration>,
    /// `/readyz` of an ingest answered 503 while there was no primary.
    pub saw_unready: bool,
}

pub(super) fn micros(us: i64) -> Duration {
    Duration::from_micros(us.max(0) as u64)
}

/// The longest gap between two 200s the provider received that contains
/// `at` (unix us).
pub(super) fn window_without_200(deliveries: &[Delivery], at: i64) -> Duration {
    let mut acked: Vec<i64> = deliveries.iter().filter_map(|d| d.acked_us).collect();
    acked.sort_unstable();
    let before = acked.iter().rev().find(|&&t| t <= at).copied().unwrap_or(at);
    let after = acked.iter().find(|&&t| t > at).copied().unwrap_or(at);
    // Answers of statements that committed just before the kill arrive
    // after it: the gap is the longest within the few seconds around it.
    let mut widest = after - before;
    for pair in acked.windows(2) {
        if pair[0] >= at - 1_000_000 && pair[0] <= at + 60_000_000 {
            widest = widest.max(pair[1] - pair[0]);
        }
    }
    micros(widest)
}

/// The primary's death and the promotion that followed, as they happened.
pub(super) struct PrimaryKilled {
    pub(super) killed: testkit::HaNode,
    pub(super) promoted: testkit::HaNode,
    pub(super) kill_us: i64,
    pub(super) promoted_after: Duration,
    pub(super) saw_unready: bool,
}

impl Running<'_> {
    /// A third of the way through phase 1's deliveries, the primary's
    /// postmaster SIGKILLed with its standby behind; then until a standby is
    /// promoted, an ingest's readiness watched.
    pub(super) async fn kill_the_primary(&self, ha: &testkit::HaCluster, planned1: u64) -> PrimaryKilled {
        while self
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|d| d.status == 200)
            .count()
            < (planned1 / 3) as usize
        {
            assert!(
                !self.done.load(Ordering::Acquire),
                "the deliveries ended before the kill"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let killed = ha
            .kill_primary_with_standby_behind(STANDBY_BEHIND)
            .await
            .expect("SIGKILL of the primary's postmaster");
        let kill_us = now_us();
        self.disruptions.lock().unwrap().push(kill_us);
        self.watched.note(&format!(
            "SIGKILL of the primary's postmaster ({}, pid {}), its standby {} ms behind",
            killed.name,
            killed.postmaster_pid,
            STANDBY_BEHIND.as_millis()
        ));
        // An ingest's readiness while there is no primary, and just after.
        let polling = Arc::new(AtomicBool::new(true));
        let poller = tokio::spawn({
            let (http, polling) = (self.stack.http.clone(), polling.clone());
            let readyz = format!("http://127.0.0.1:{}/readyz", self.stack.admins[0]);
            async move {
                let mut unready = false;
                while polling.load(Ordering::Acquire) {
                    if let Ok(r) = http.get(&readyz).send().await {
                        unready |= r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                unready
            }
        });
        let promoted =
            tokio::task::block_in_place(|| ha.wait_for_new_primary(&killed.name, Duration::from_secs(60)))
                .expect("a standby promoted");
        let promoted_after = micros(now_us() - kill_us);
        tokio::time::sleep(Duration::from_millis(500)).await;
        polling.store(false, Ordering::Release);
        let saw_unready = poller.await.unwrap();
        self.watched.note(&format!(
            "{} promoted {:.1} s after the kill",
            promoted.name,
            promoted_after.as_secs_f64()
        ));
        PrimaryKilled {
            killed,
            promoted,
            kill_us,
            promoted_after,
            saw_unready,
        }
    }
}

/// Until the relays' LISTEN connections found the new primary (their claims
/// alone would also come from polling).
pub(super) async fn until_both_relays_listen(client: &tokio_postgres::Client, watched: &Watched<'_>) {
    let started = Instant::now();
    loop {
        let listening = testkit::count(
            client,
            "SELECT count(*) FROM pg_stat_activity
              WHERE application_name = 'outbox-relay-listen' AND datname = current_database()",
        )
        .await;
        if listening == 2 {
            watched.note("both relays LISTEN on the new primary");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{listening} relays of 2 LISTEN on the new primary 30 s after the failover"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl PrimaryKilled {
    /// The failover as the evidence shows it: how long without a 200, and
    /// until the relays claimed and called again.
    pub(super) fn measured(
        self,
        writes: &[RowWrite],
        keys: &HashMap<String, KeyRecord>,
        deliveries: &[Delivery],
    ) -> Failover {
        let kill_us = self.kill_us;
        let first_claim = writes
            .iter()
            .filter(|w| w.claimed && w.at_us > kill_us)
            .map(|w| w.at_us)
            .min();
        let first_call = first_claim.and_then(|claim_us| {
            keys.values()
                .flat_map(|k| &k.calls)
                .map(|c| c.arrived_us as i64)
                .filter(|&t| t >= claim_us)
                .min()
        });
        Failover {
            killed: self.killed,
            promoted: self.promoted,
            promoted_after: self.promoted_after,
            no_200_window: window_without_200(deliveries, kill_us),
            first_claim_after: first_claim.map(|t| micros(t - kill_us)),
            first_call_after: first_call.map(|t| micros(t - kill_us)),
            saw_unready: self.saw_unready,
        }
    }
}
