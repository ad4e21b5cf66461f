//! The network between a real relay process and the downstream fails, through
//! the simulator's fault-injecting proxy: answers later than the relay's
//! timeout, connections cut after the request went through (the downstream
//! did the work, the relay saw an error), black holes, refusal. Whatever the
//! relay saw, every effect happens exactly once: the relay retries under the
//! same key until it learns the outcome, and the downstream deduplicates.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use simulator::downstream::Stats;
use simulator::proxy::{self, Faults, ProxyConfig, RunningProxy};

use crate::helpers::{Env, env};

/// Enough rows that the relay is still draining when the last fault ends.
const ROWS: i64 = 600;

const DONE: &str = "SELECT count(*) FROM outbox WHERE status = 'done'";

/// How long each fault lasts: three or more rounds of the relay's 500 ms
/// timeout, and several retries of a row with 50 ms to 1 s of backoff.
const FAULT_FOR: Duration = Duration::from_millis(1500);

/// What one moment looked like, from the three sides.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    /// The relay's calls: every claim is one (`sum(attempts)`).
    calls: i64,
    done: i64,
    /// What reached the downstream, and what it did.
    requests: u64,
    effects: u64,
    replays: u64,
    conflicts: u64,
    /// What the proxy did.
    connections: u64,
    delays: u64,
    cuts: u64,
    blackholes: u64,
    refusals: u64,
    refused_resets: u64,
}

impl Tally {
    async fn take(env: &Env, proxy: &RunningProxy) -> Self {
        let calls = env
            .count("SELECT coalesce(sum(attempts), 0)::int8 FROM outbox")
            .await;
        let done = env.count(DONE).await;
        let downstream: Stats = env.stats().await;
        let p = proxy.stats();
        Self {
            calls,
            done,
            requests: downstream.requests,
            effects: downstream.effects,
            replays: downstream.replays,
            conflicts: downstream.status_count("409"),
            connections: p.connections,
            delays: p.injected.delays,
            cuts: p.injected.cuts,
            blackholes: p.injected.blackholes,
            refusals: p.injected.refusals,
            refused_resets: p.injected.refused_resets,
        }
    }

    /// What happened between `before` and `self`.
    fn since(&self, before: &Self) -> Self {
        Self {
            calls: self.calls - before.calls,
            done: self.done - before.done,
            requests: self.requests - before.requests,
            effects: self.effects - before.effects,
            replays: self.replays - before.replays,
            conflicts: self.conflicts - before.conflicts,
            connections: self.connections - before.connections,
            delays: self.delays - before.delays,
            cuts: self.cuts - before.cuts,
            blackholes: self.blackholes - before.blackholes,
            refusals: self.refusals - before.refusals,
            refused_resets: self.refused_resets - before.refused_resets,
        }
    }

    fn row(&self, phase: &str, took: Duration) -> String {
        format!(
            "{phase:<28} {:>6} {:>6} {:>6} | {:>8} {:>7} {:>7} {:>5} | {:>5} {:>6} {:>4} {:>5} {:>6}",
            took.as_millis(),
            self.calls,
            self.done,
            self.requests,
            self.effects,
            self.replays,
            self.conflicts,
            self.connections,
            self.delays,
            self.cuts,
            self.blackholes,
            self.refusals + self.refused_resets,
        )
    }
}

const HEADER: &str = "phase                            ms  calls   done | requests effects replays   409 | conns delays cuts holes refuse overdue";

/// Rows claimed whose lease has run out while the relay still holds them.
const HELD_PAST_LEASE: &str = "SELECT count(*) FROM outbox
  WHERE status = 'pending' AND lease_owner IS NOT NULL AND leased_until < now()";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_faults_between_relay_and_downstream_never_double_an_effect() {
    let env = env().await;
    env.set_latency("20").await;
    let upstream: SocketAddr = env
        .url()
        .trim_start_matches("http://")
        .parse()
        .expect("the downstream's address");
    let proxy = proxy::spawn(ProxyConfig::new(upstream))
        .await
        .expect("starting the proxy");
    let url = proxy.url();
    env.seed(1, ROWS).await;

    let relay = env.spawn_relay(&[
        ("FULFILMENT_URL", &url),
        ("EMAIL_URL", &url),
        ("RELAY_HTTP_TIMEOUT_MS", "500"),
        ("RELAY_LEASE_SECS", "2"),
        // Rows held (calls in flight plus one batch) are sent within the
        // lease even when every call takes its whole timeout: 8 rows, 4 at a
        // time, 2 x 500 ms < 2 s.
        ("RELAY_CONCURRENCY", "4"),
        ("RELAY_BATCH_SIZE", "4"),
        ("RELAY_BACKOFF_BASE_MS", "50"),
        ("RELAY_BACKOFF_MAX_SECS", "1"),
        // Dead rows are not this test's subject: every row must get through.
        ("RELAY_MAX_ATTEMPTS", "1000"),
        ("RELAY_POLL_INTERVAL_MS", "100"),
        ("RELAY_PRUNE_INTERVAL_SECS", "0"),
    ]);
    // The relay is draining before the first fault.
    env.wait_for(
        "SELECT least(count(*), 20) FROM outbox WHERE status = 'done'",
        20,
        Duration::from_secs(15),
    )
    .await;

    let run = through_the_faults(&env, &proxy).await;
    eprintln!("{}", run.lines.join("\n"));
    relay.signal("TERM");
    let (code, stderr) = relay.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{stderr}");

    // Every row done, none left leased.
    assert_eq!(env.count(DONE).await, ROWS);
    assert_eq!(
        env.count("SELECT count(*) FROM outbox WHERE lease_owner IS NOT NULL OR leased_until IS NOT NULL")
            .await,
        0,
        "no row left leased"
    );

    // Exactly one effect per key, by the downstream's own records.
    let stats = env.stats().await;
    let keys = stats.keys.as_ref().expect("stats with keys");
    assert_eq!(keys.len() as i64, ROWS);
    for (key, k) in keys {
        assert_eq!(
            k.effects, 1,
            "{key}: {} requests, statuses {:?}",
            k.requests, k.statuses
        );
    }
    assert_eq!(stats.effects as i64, ROWS);
    assert_eq!(stats.double_effects, 0, "{:?}", stats.double_effect_targets);

    the_faults_really_happened(&stats, &run);
}

/// What the phases did: the table's lines, each phase's tally, the total.
struct Run {
    lines: Vec<String>,
    deltas: Vec<(&'static str, Tally)>,
    total: Tally,
}

/// The faults in turn, each for its time, then healed until every row is
/// done; the proxy's and the downstream's counts per phase.
async fn through_the_faults(env: &Env, proxy: &RunningProxy) -> Run {
    let started = Instant::now();
    let mut lines = vec![HEADER.to_owned()];
    let mut deltas = Vec::new();
    let mut before = Tally::take(env, proxy).await;
    for (phase, faults, lasting) in phases() {
        let at = Instant::now();
        proxy.set_faults(faults).unwrap();
        // Meanwhile, watch for rows the relay still holds past their lease
        // (claimed, neither sent nor recorded in time): another relay could
        // take and send them while this one still means to.
        let mut overdue = 0;
        while at.elapsed() < lasting {
            overdue = overdue.max(env.count(HELD_PAST_LEASE).await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let now = Tally::take(env, proxy).await;
        let delta = now.since(&before);
        lines.push(format!("{} {overdue:>7}", delta.row(phase, at.elapsed())));
        deltas.push((phase, delta));
        before = now;
    }

    // Healed: everything gets through.
    let healed_at = Instant::now();
    proxy.set_faults(Faults::default()).unwrap();
    env.wait_for(DONE, ROWS, Duration::from_secs(20)).await;
    let end = Tally::take(env, proxy).await;
    lines.push(
        end.since(&before)
            .row("healed, until all done", healed_at.elapsed()),
    );
    let total = end.since(&Tally::default());
    lines.push(total.row("total", started.elapsed()));

    Run { lines, deltas, total }
}

/// The faults, healthy first: a delay past the relay's timeout, the answer
/// cut, a black hole, connections refused.
fn phases() -> [(&'static str, Faults, Duration); 5] {
    [
        ("healthy", Faults::default(), Duration::from_millis(500)),
        (
            "delay 800 ms (timeout 500)",
            Faults {
                delay_ms: 800,
                ..Faults::default()
            },
            FAULT_FOR,
        ),
        (
            "cut when the answer starts",
            Faults {
                cut_after_bytes: Some(0),
                ..Faults::default()
            },
            FAULT_FOR,
        ),
        (
            "black hole",
            Faults {
                blackhole: true,
                ..Faults::default()
            },
            FAULT_FOR,
        ),
        (
            "refused",
            Faults {
                refuse: true,
                ..Faults::default()
            },
            FAULT_FOR,
        ),
    ]
}

/// The faults really happened, and hid outcomes from the relay.
fn the_faults_really_happened(stats: &Stats, run: &Run) {
    let keys = stats.keys.as_ref().expect("stats with keys");
    let retried = keys.values().filter(|k| k.requests > 1).count();
    assert!(retried > 0, "no key was sent twice");
    assert!(
        stats.replays > 0,
        "no request found its work already done: no answer was lost"
    );
    assert!(run.total.calls > ROWS, "the relay called more than once per row");
    let phase = |name: &str| run.deltas.iter().find(|(p, _)| p.starts_with(name)).unwrap().1;
    let delayed = phase("delay");
    assert!(delayed.delays > 0, "{delayed:?}");
    assert!(
        delayed.calls > delayed.done,
        "calls timed out while delayed: {delayed:?}"
    );
    let cut = phase("cut");
    assert!(cut.cuts > 0, "{cut:?}");
    assert!(
        cut.effects + cut.replays > 0,
        "requests went through before their answer was cut: {cut:?}"
    );
    let holed = phase("black hole");
    assert!(holed.blackholes > 0, "{holed:?}");
    let refused = phase("refused");
    assert_eq!(refused.refusals, 1, "{refused:?}");
    assert_eq!(refused.requests, 0, "nothing reached the downstream: {refused:?}");
    assert!(refused.calls > 0, "the relay tried while refused: {refused:?}");
    eprintln!(
        "{retried} of {ROWS} keys requested more than once; max {} requests for one key; {} replays",
        keys.values().map(|k| k.requests).max().unwrap_or(0),
        stats.replays
    );
}
