//! `make failover`: an acknowledged payment survives the loss of the primary
//! (docs/CONTRACT.md, "Durability and failover").
//!
//! The history checker's workload (payments, refunds racing them,
//! duplicates, orders created after their payments, two ingests, two relays
//! draining against a faulty downstream) runs on a real high-availability
//! Postgres: Patroni with etcd, two nodes, on loopback
//! (`scripts/ha-cluster.sh`, through `testkit::HaCluster`). A third of the
//! way through, the primary's postmaster gets SIGKILL; Patroni promotes the
//! standby; nothing is restarted by hand: the services find the new primary
//! through their multi-host `DATABASE_URL` (`target_session_attrs=read-write`).
//!
//! With synchronous replication it checks every event the provider holds a
//! 200 for is on the new primary, no double effect at the downstream, every
//! per-order rule, the relays drained to zero, and `/readyz` answering 503
//! while there was no primary; it prints the window with no 200 and the time
//! to the relays' first claim and call after the kill. Then the same run
//! with asynchronous replication reports the acknowledged events it lost
//! (`FAILOVER_ASYNC_RUNS` runs, default 1): what an operator risks without
//! synchronous replication. Each run starts its own cluster.
//!
//! Ignored in `make test` (it needs Patroni and etcd, and a cluster of its
//! own per run): `make failover` runs it, and CI runs `make failover`.

use std::time::Duration;

use testkit::{HaCluster, Replication};

use crate::history::{self, Cluster, Options, Run};

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn seconds(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()))
}

async fn run_on(replication: Replication, seed: u64) -> Run {
    let orders = setting("FAILOVER_ORDERS", 1500) as i64;
    let cluster = tokio::task::block_in_place(|| HaCluster::start(replication)).expect("a Patroni cluster");
    eprintln!(
        "failover: {replication:?} replication, seed {seed}, {orders} orders\n{}",
        cluster.status()
    );
    let run = history::run(Options {
        orders,
        seed,
        chaos: false,
        retention: false,
        in_flight: setting("FAILOVER_IN_FLIGHT", 96) as usize,
        cluster: Cluster::Ha(&cluster),
    })
    .await;
    let failover = run.failover.as_ref().expect("the primary was killed");
    eprintln!(
        "failover: {replication:?}: {} killed, {} promoted {:.2} s after; no 200 for {:.2} s; \
         first claim on the new primary {} and first downstream call {} after the kill; \
         {} of {} acknowledged events missing on the new primary",
        failover.killed.name,
        failover.promoted.name,
        failover.promoted_after.as_secs_f64(),
        failover.no_200_window.as_secs_f64(),
        seconds(failover.first_claim_after),
        seconds(failover.first_call_after),
        run.lost.len(),
        run.acknowledged,
    );
    eprint!("{}", run.report);
    drop(cluster);
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Patroni, etcd and a cluster of its own: make failover"]
async fn an_acknowledged_payment_survives_the_loss_of_the_primary() {
    let seed = setting("FAILOVER_SEED", history::now_us() as u64);
    let run = run_on(Replication::Sync, seed).await;
    let failover = run.failover.as_ref().unwrap();
    assert!(
        run.lost.is_empty(),
        "synchronous replication lost {} acknowledged events: {:?}",
        run.lost.len(),
        &run.lost[..run.lost.len().min(10)]
    );
    assert!(
        failover.saw_unready,
        "/readyz never answered 503 while there was no primary"
    );
    assert!(
        failover.first_claim_after.is_some(),
        "no relay claimed a row on the new primary"
    );
    assert!(
        run.report.applied_later > 0,
        "no event arrived before its order and was applied later"
    );
    assert_eq!(run.report.total_violations(), 0, "{}", run.report);

    // What asynchronous replication risks, on the same workload.
    let runs = setting("FAILOVER_ASYNC_RUNS", 1);
    let mut lost = Vec::new();
    for n in 0..runs {
        let run = run_on(Replication::Async, seed.wrapping_add(n + 1)).await;
        lost.push((run.lost.len(), run.acknowledged, run.report.total_violations()));
    }
    for (n, (lost, acknowledged, violations)) in lost.iter().enumerate() {
        eprintln!(
            "failover: asynchronous run {}: {lost} of {acknowledged} acknowledged events lost, {violations} per-order violations",
            n + 1
        );
    }
}
