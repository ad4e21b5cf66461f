//! Exactly once per ORDER, proven by generated histories.
//!
//! A few thousand orders each get a random history: payments, refunds,
//! second distinct payments and refunds, refunds before payments, ignored
//! event types, duplicates and provider retries, plus events for payment ids
//! no order has. The distinct events of one order are delivered at the same
//! moment (or a few milliseconds apart) on separate connections, spread over
//! two ingest processes, while two relays drain the outbox against a
//! downstream that answers 5xx and 429, resets connections, and holds some
//! answers past the relays' timeout after doing the work. Some orders then
//! live through retention: their rows and events are aged eight days and
//! pruned, and the provider resends old events and sends new refunds.
//!
//! Some orders are created after their payments, as a shop's checkout often
//! commits after the provider's webhook: while the first deliveries are in
//! flight, a second or two later, or only after the payments aged past
//! retention (which must keep them). Their events are answered `unmatched`
//! and must be applied by the ingests themselves once the order exists,
//! exactly once, in the order's commit order.
//!
//! Then every order is checked by [`check::check`] against
//! `domain::transition` applied in commit order. `make soak` runs it bigger,
//! with relays SIGKILLed every few seconds, an ingest SIGKILLed once, and
//! Postgres restarted once (`HISTORY_ORDERS`, `HISTORY_CHAOS=1`).
//!
//! The test records what the checker needs with triggers of its own
//! (`history_events`, `history_outbox`), installed in the test database by
//! the superuser; the product's schema and grants are untouched.
//!
//! Every 5 s it prints where it is on stderr ([`Progress`]): deliveries
//! sent and acknowledged, effects at the downstream, the rate, the phase and
//! the chaos so far; then the drains, the prune and the check.

pub(crate) mod check;
mod collect;
mod failover;
mod plan;
mod retention;
mod stack;
mod watch;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt as _;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use simulator::downstream::{DownstreamConfig, Faults, Latency, RunningDownstream};
use testkit::{PrivateCluster, Role};

use self::check::{Claim, Delivery, Evidence, KeyRecord, RowWrite};
use crate::harness::{Proc, RelayTuning, SECRET, TempDir, try_post_signed, wait_ready};
use crate::progress::{Progress, thousands};

use self::collect::*;
pub(crate) use self::failover::Failover;
use self::failover::*;
use self::plan::*;
use self::stack::*;
use self::watch::*;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub(crate) fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as i64
}

/// Which cluster a history runs on, and what befalls it.
pub(crate) enum Cluster<'a> {
    /// One node: `HISTORY_CHAOS` (make soak) stops and restarts it.
    Private(&'a PrivateCluster),
    /// Patroni: the primary's postmaster is SIGKILLed in the middle of the
    /// deliveries, its standby [`STANDBY_BEHIND`] behind, and the cluster
    /// promotes the standby.
    Ha(&'a testkit::HaCluster),
}

pub(crate) struct Options<'a> {
    pub orders: i64,
    pub seed: u64,
    /// Relays and an ingest SIGKILLed, Postgres restarted (a private cluster).
    pub chaos: bool,
    /// The retention phase and the resends after it (phase 2).
    pub retention: bool,
    /// Orders whose events are being delivered at once.
    pub in_flight: usize,
    pub cluster: Cluster<'a>,
}

pub(crate) struct Run {
    pub report: check::Report,
    /// Distinct events the provider holds a 200 for.
    pub acknowledged: usize,
    /// Of those, the ones not on the (new) primary at the end.
    pub lost: Vec<String>,
    pub failover: Option<Failover>,
}

/// Runs a history (see the module) and checks it; the caller asserts.
pub(crate) async fn run(options: Options<'_>) -> Run {
    let histories = generate_histories(options.orders, options.seed, options.retention);
    let (stack, mut processes) = start_stack(&options.cluster, options.orders, &histories.late).await;
    let chaos_so_far = ChaosSoFar::default();
    let progress = Mutex::new(Progress::start("history"));
    let running = Running {
        stack: &stack,
        watched: Watched {
            progress: &progress,
            downstream: &stack.downstream,
            chaos: options.chaos.then_some(&chaos_so_far),
        },
        chaos_so_far: &chaos_so_far,
        log: Mutex::new(Vec::new()),
        disruptions: Mutex::new(Vec::new()),
        done: AtomicBool::new(false),
    };
    let failover = running
        .deliver_phase1_with_faults(&options, &histories, &mut processes)
        .await;
    // A fresh connection: a restart or a failover closed the first one.
    let client = testkit::TestDb::connect_url(&stack.url).await;
    running
        .watched
        .until_drained(&client, "phase 1", Duration::from_secs(120))
        .await;
    if let Cluster::Ha(_) = options.cluster {
        until_both_relays_listen(&client, &running.watched).await;
    }
    let phase1_end: i64 = client
        .query_one("SELECT last_value FROM history_seq", &[])
        .await
        .unwrap()
        .get(0);

    let mut keys = HashMap::new();
    let pruned = if options.retention {
        running
            .retention_then_phase2(&client, options.in_flight, &histories, &mut keys)
            .await
    } else {
        HashSet::new()
    };
    running.assert_some_deliveries_batched().await;
    processes.stop();
    merge(&mut keys, &stack.downstream.stats());

    let collected = collect_from_database(&client, phase1_end).await;
    let deliveries = std::mem::take(&mut *running.log.lock().unwrap());
    let (acknowledged, lost) = acknowledged_but_lost(&client, &deliveries, &pruned).await;
    let failover = failover.map(|killed| killed.measured(&collected.writes, &keys, &deliveries));
    let evidence = Evidence {
        claims: collected.claims,
        writes: collected.writes,
        deliveries,
        orders: collected.orders,
        rows: collected.rows,
        keys,
        planned: histories.planned,
        pruned,
        disruptions: running.disruptions.lock().unwrap().clone(),
        http_timeout_us: HTTP_TIMEOUT_MS as i64 * 1000,
        lease_us: RELAY.lease_secs as i64 * 1_000_000,
        late_orders: stack.shop.created.lock().unwrap().clone(),
    };
    running.watched.note(&format!(
        "checking {} orders: {} claims, {} outbox writes, {} deliveries",
        thousands(options.orders as u64),
        thousands(evidence.claims.len() as u64),
        thousands(evidence.writes.len() as u64),
        thousands(evidence.deliveries.len() as u64)
    ));
    let report = check::check(&evidence);
    running.watched.note("checked");
    Run {
        report,
        acknowledged,
        lost,
        failover,
    }
}

/// What the steps of a run share.
struct Running<'a> {
    stack: &'a Stack,
    watched: Watched<'a>,
    chaos_so_far: &'a ChaosSoFar,
    /// Every delivery attempt the provider made, in both phases.
    log: Mutex<Vec<Delivery>>,
    /// Moments (unix us) a relay was killed or Postgres went away: a relay
    /// may have held a success it never got to record.
    disruptions: Mutex<Vec<i64>>,
    /// Phase 1's deliveries are over: the chaos stops, and a failover not
    /// yet begun fails.
    done: AtomicBool,
}

impl Running<'_> {
    /// Phase 1: every history delivered, with the chaos (a soak run) or the
    /// primary's death (an HA cluster) beside it.
    async fn deliver_phase1_with_faults(
        &self,
        options: &Options<'_>,
        histories: &Histories,
        processes: &mut Processes,
    ) -> Option<PrimaryKilled> {
        let phase1 = &histories.phase1;
        let planned1 = planned_deliveries(phase1);
        self.watched.note(&format!(
            "phase 1: {} events of {} orders ({} created after their payments) and stray payments, {} deliveries{}",
            thousands(phase1.iter().map(|g| g.events.len() as u64).sum()),
            thousands(options.orders as u64),
            thousands(histories.late.len() as u64),
            thousands(planned1),
            match options.cluster {
                Cluster::Private(_) if options.chaos =>
                    "; a relay SIGKILLed every 4 s, an ingest after 10 s, Postgres restarted after 20 s",
                Cluster::Ha(_) => "; the primary's postmaster SIGKILLed a third of the way",
                Cluster::Private(_) => "",
            }
        ));
        let delivering = self.watched.delivering(1, planned1, &self.log, async {
            deliver_all(self.stack, phase1, 1, options.in_flight, &self.log).await;
            self.done.store(true, Ordering::Release);
        });
        let chaos = async {
            if let Cluster::Private(private) = options.cluster
                && options.chaos
            {
                self.chaos_until_delivered(private, processes).await;
            }
        };
        let failover = async {
            match options.cluster {
                Cluster::Ha(ha) => Some(self.kill_the_primary(ha, planned1).await),
                Cluster::Private(_) => None,
            }
        };
        let ((), (), failover) = tokio::join!(delivering, chaos, failover);
        failover
    }

    /// A soak run's chaos until phase 1 is delivered: a relay SIGKILLed
    /// every 4 s and replaced at once, one ingest SIGKILLed after 10 s, and
    /// Postgres stopped and restarted after 20 s.
    async fn chaos_until_delivered(&self, private: &PrivateCluster, processes: &mut Processes) {
        let started = Instant::now();
        let (mut ingest_killed, mut restarted) = (false, false);
        let mut victim = 0usize;
        while !self.done.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_secs(4)).await;
            processes.relays[victim % 2].signal("KILL");
            self.disruptions.lock().unwrap().push(now_us());
            processes.relays[victim % 2] = self.stack.spawn_relay();
            victim += 1;
            self.chaos_so_far.relays_killed.fetch_add(1, Ordering::Relaxed);
            if !ingest_killed && started.elapsed() > Duration::from_secs(10) {
                self.watched.note("SIGKILL one ingest of two, restarted at once");
                processes.ingests[0].signal("KILL");
                let _ = processes.ingests[0].child.wait();
                processes.ingests[0] = self.stack.spawn_ingest(0);
                ingest_killed = true;
                self.chaos_so_far.ingests_killed.fetch_add(1, Ordering::Relaxed);
            } else if ingest_killed && !restarted && started.elapsed() > Duration::from_secs(20) {
                self.watched.note("Postgres: fast shutdown, restarted 2 s later");
                private.stop().expect("fast shutdown");
                self.disruptions.lock().unwrap().push(now_us());
                tokio::time::sleep(Duration::from_secs(2)).await;
                private.resume().expect("restart");
                restarted = true;
                self.chaos_so_far
                    .postgres_restarts
                    .fetch_add(1, Ordering::Relaxed);
                self.watched.note("Postgres: restarted");
            }
        }
        assert!(
            restarted,
            "the deliveries ended before the chaos: raise HISTORY_ORDERS"
        );
        eprintln!("history: chaos: {victim} relays SIGKILLed, 1 ingest SIGKILLed, Postgres restarted once");
    }

    /// The histories went through batches (else this test proves nothing of
    /// them). After a chaos run's SIGKILL the first ingest's counters
    /// restart, so they are read from both.
    async fn assert_some_deliveries_batched(&self) {
        let mut batched = 0.0;
        for admin in self.stack.admins {
            let metrics =
                testkit::metrics::Metrics::fetch(&self.stack.http, &format!("http://127.0.0.1:{admin}"))
                    .await
                    .unwrap();
            let get = |name: &str| metrics.find(name, &[]).unwrap_or(0.0);
            eprintln!(
                "history: ingest at {admin}: {} batches of {} deliveries, {} left alone (order locked), {} batches failed, {} unmatched events applied",
                get("webhook_record_batches_total"),
                get("webhook_record_batched_deliveries_total"),
                get("webhook_record_batch_contended_total"),
                get("webhook_record_batch_failures_total"),
                get("webhook_unmatched_applied_total"),
            );
            batched += get("webhook_record_batched_deliveries_total");
        }
        assert!(batched > 0.0, "no delivery was recorded in a batch");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_ends_as_the_domain_rules_say_whatever_the_interleaving() {
    let orders = setting("HISTORY_ORDERS", 2500) as i64;
    let chaos = setting("HISTORY_CHAOS", 0) == 1;
    let seed = setting("HISTORY_SEED", now_us() as u64);
    eprintln!(
        "history: seed {seed} (HISTORY_SEED={seed} replays this history), {orders} orders, chaos {chaos}"
    );
    let cluster = PrivateCluster::start().expect("a private cluster");
    let run = run(Options {
        orders,
        seed,
        chaos,
        retention: true,
        in_flight: 24,
        cluster: Cluster::Private(&cluster),
    })
    .await;
    let report = run.report;
    eprint!("{report}");
    let out = testkit::workspace_root().join("target/history");
    let _ = std::fs::create_dir_all(&out);
    let _ = std::fs::write(
        out.join("report.txt"),
        format!("seed {seed}\n{report}every violation:\n{}", report.all_details()),
    );
    assert!(
        report.payment_refund_pairs_overlapping > 0,
        "no payment and refund of one order were ever in flight together"
    );
    assert!(
        report.applied_later > 0,
        "no event arrived before its order and was applied later"
    );
    assert!(
        run.lost.is_empty(),
        "acknowledged but not recorded: {:?}",
        run.lost
    );
    assert_eq!(report.total_violations(), 0, "{report}");
}
