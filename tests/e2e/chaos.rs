//! Chaos: exactly-once effects while processes, the network and the database fail.
//!
//! The real binaries: two ingests behind the simulated provider, two relays,
//! a downstream injecting 5% 5xx, 2% 429 with Retry-After, latency jitter and
//! connection resets. While the provider sends thousands of events with
//! duplicates (concurrent bursts, and late redeliveries after the main phase):
//! a relay is SIGKILLed every few seconds and replaced, an ingest is SIGKILLed
//! mid-load and restarted, and Postgres is restarted (fast shutdown). At the
//! end, from the downstream's own records: every event the ingest
//! acknowledged has exactly one effect per command, nothing else has an
//! effect, nothing is pending or leased, and the provider got a 2xx for every
//! event.
//!
//! The services log in as members of the least-privilege roles
//! (`migrations/V2__roles.sql`), as in production.
//!
//! `CHAOS_EVENTS` and `CHAOS_RATE` scale it (`make soak`). Every 5 s it
//! prints where it is on stderr ([`Progress`]): events the provider has
//! sent (its schedule) and the ingests recorded, effects at the downstream,
//! the rate, the phase and the chaos so far.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use simulator::downstream::{DownstreamConfig, Faults, Latency};
use testkit::{PrivateCluster, Role};

use crate::harness::{Proc, RelayTuning, SECRET, TempDir, wait_ready};
use crate::progress::{Progress, thousands};

use self::checks::*;
use self::stack::*;

mod checks;
mod stack;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Default)]
struct Tally {
    events: u64,
    deliveries: u64,
    duplicates: u64,
    relay_kills: u64,
    ingest_kills: u64,
    postgres_restarts: u64,
    requests: u64,
    effects: u64,
    double_effects: u64,
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "chaos tally: events {} | deliveries {} | duplicates {} | kills {} relay + {} ingest | \
             postgres restarts {} | downstream requests {} | effects {} | double effects {}",
            self.events,
            self.deliveries,
            self.duplicates,
            self.relay_kills,
            self.ingest_kills,
            self.postgres_restarts,
            self.requests,
            self.effects,
            self.double_effects
        )
    }
}

/// The chaos beside the provider's load, until the provider exits: a relay
/// SIGKILLed and replaced every 4 s, one ingest SIGKILLed at 30% of the
/// main phase and restarted, Postgres fast-shut-down at 55% and restarted.
async fn chaos(
    stack: &mut Stack,
    provider: &mut Proc,
    events: u64,
    rate: u64,
    tally: &mut Tally,
    progress: &mut Progress,
) {
    let main_phase = Duration::from_secs_f64(events as f64 / rate as f64);
    let started = Instant::now();
    progress.note(&format!(
        "sending {} events at {rate}/s (about {:.0} s), then late duplicates; a relay SIGKILLed every 4 s",
        thousands(events),
        main_phase.as_secs_f64()
    ));
    let mut recorded = Recorded::new(&stack.url);
    let mut last_recorded = (0, 0);
    let ingest_kill_at = main_phase.mul_f64(0.3);
    let restart_at = main_phase.mul_f64(0.55);
    let mut next_relay_kill = Duration::from_secs(3);
    while provider.child.try_wait().unwrap().is_none() {
        let now = started.elapsed();
        if now >= next_relay_kill {
            let victim = tally.relay_kills as usize % stack.relays.len();
            stack.relays[victim].signal("KILL");
            stack.relays[victim] = stack.relay();
            tally.relay_kills += 1;
            next_relay_kill = now + Duration::from_secs(4);
        }
        if tally.ingest_kills == 0 && now >= ingest_kill_at {
            progress.note("SIGKILL one ingest of two, restarted 0.8 s later");
            stack.ingests[0].signal("KILL");
            let _ = stack.ingests[0].child.wait();
            tokio::time::sleep(Duration::from_millis(800)).await;
            stack.ingests[0] = stack.ingest(0);
            tally.ingest_kills += 1;
        }
        if tally.postgres_restarts == 0 && now >= restart_at {
            progress.note("Postgres: fast shutdown, restarted 2 s later");
            stack.cluster.stop().expect("fast shutdown");
            tokio::time::sleep(Duration::from_secs(2)).await;
            stack.cluster.resume().expect("restart");
            tally.postgres_restarts += 1;
            progress.note("Postgres: restarted");
        }
        if progress.due() {
            let read = recorded.read().await;
            last_recorded = read.unwrap_or(last_recorded);
            let phase = if now < main_phase {
                "sending"
            } else {
                "late duplicates and retries"
            };
            // The provider's schedule (open loop at `rate`), started just before `started`.
            let sent = ((now.as_secs_f64() * rate as f64) as u64)
                .max(last_recorded.0)
                .min(events);
            let totals = stack.downstream.totals();
            progress.line(
                phase,
                &format!(
                    "events sent {}/{}, acknowledged {} (deliveries {}{}) | effects {} (requests {}) | \
                     kills {} relay + {} ingest, Postgres restarts {}",
                    thousands(sent),
                    thousands(events),
                    thousands(last_recorded.0),
                    thousands(last_recorded.1),
                    if read.is_none() {
                        "; the database is unreachable: as of the last line"
                    } else {
                        ""
                    },
                    thousands(totals.effects),
                    thousands(totals.requests),
                    tally.relay_kills,
                    tally.ingest_kills,
                    tally.postgres_restarts
                ),
                last_recorded.0,
                "events",
            );
        }
        assert!(
            now < main_phase + Duration::from_secs(150),
            "the provider never finished"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        tally.ingest_kills == 1 && tally.postgres_restarts == 1,
        "the run ended before the chaos"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_effects_survive_kills_restarts_and_a_faulty_downstream() {
    let events = setting("CHAOS_EVENTS", 3000);
    let rate = setting("CHAOS_RATE", 50);
    let mut stack = Stack::start(events).await;
    let ack_file = stack.dir.0.join("acks.jsonl");
    let mut provider = stack.provider(events, rate, &ack_file);
    let mut tally = Tally {
        events,
        ..Tally::default()
    };

    let mut progress = Progress::start("chaos");
    chaos(&mut stack, &mut provider, events, rate, &mut tally, &mut progress).await;
    let summary = provider_summary(&provider, events, &mut tally, &progress);
    let client = testkit::TestDb::connect_url(&stack.url).await;
    drain(&client, &stack, &mut progress).await;
    stack.stop_services();

    let (acknowledged, recorded) = check_acknowledgements(&client, &ack_file, events).await;
    check_effects(&client, &stack, &acknowledged, &mut tally).await;
    let processed = recorded.values().filter(|s| *s == "processed").count();
    assert!(
        processed as u64 > events / 2,
        "most events paid an order: {processed}"
    );

    eprintln!("{tally}");
    eprintln!(
        "provider latency under chaos: p50 {} ms, p99 {} ms, p99.9 {} ms ({} retries, {} timeouts, {} connection errors)",
        summary["latency_ms"]["p50"],
        summary["latency_ms"]["p99"],
        summary["latency_ms"]["p999"],
        summary["retries"],
        summary["timeouts"],
        summary["connection_errors"]
    );
    let out = testkit::workspace_root().join("target/chaos");
    let _ = std::fs::create_dir_all(&out);
    let _ = std::fs::write(out.join("tally.txt"), format!("{tally}\nprovider: {summary}\n"));
}
