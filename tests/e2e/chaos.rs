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

use crate::harness::{Proc, SECRET, TempDir, wait_ready};
use crate::progress::{Progress, thousands};

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

/// Events and deliveries the ingests recorded so far, read for the
/// progress line on a connection of its own, made again after the Postgres
/// restart (`None` while the server is down).
struct Recorded {
    database: db::Database,
    client: Option<tokio_postgres::Client>,
}

impl Recorded {
    fn new(url: &str) -> Self {
        Self {
            database: db::Database::parse(url).unwrap(),
            client: None,
        }
    }

    /// A fresh connection when the last one broke (the restart closes it).
    async fn read(&mut self) -> Option<(u64, u64)> {
        for _ in 0..2 {
            let read = async {
                if self.client.is_none() {
                    let client = self.database.connect_with_default_search_path("chaos-progress");
                    self.client = Some(client.await.ok()?);
                }
                let row = self
                    .client
                    .as_ref()?
                    .query_one(
                        "SELECT count(*), coalesce(sum(deliveries), 0)::int8 FROM processed_events",
                        &[],
                    )
                    .await
                    .ok()?;
                Some((row.get::<_, i64>(0) as u64, row.get::<_, i64>(1) as u64))
            };
            match tokio::time::timeout(Duration::from_secs(2), read).await {
                Ok(Some(recorded)) => return Some(recorded),
                _ => self.client = None,
            }
        }
        None
    }
}

struct Ports {
    ingest: [u16; 2],
    ingest_admin: [u16; 2],
}

fn ingest_env(url: &str, ports: &Ports, i: usize) -> Vec<(String, String)> {
    vec![
        ("DATABASE_URL".into(), url.into()),
        ("WEBHOOK_SECRETS".into(), SECRET.into()),
        (
            "INGEST_LISTEN_ADDR".into(),
            format!("127.0.0.1:{}", ports.ingest[i]),
        ),
        (
            "ADMIN_LISTEN_ADDR".into(),
            format!("127.0.0.1:{}", ports.ingest_admin[i]),
        ),
        ("INGEST_DEADLINE_MS".into(), "2000".into()),
        ("LOG_FORMAT".into(), "json".into()),
        ("RUST_LOG".into(), "warn".into()),
    ]
}

fn relay_env(url: &str, downstream: &str) -> Vec<(String, String)> {
    vec![
        ("DATABASE_URL".into(), url.into()),
        ("FULFILMENT_URL".into(), downstream.into()),
        ("EMAIL_URL".into(), downstream.into()),
        ("ADMIN_LISTEN_ADDR".into(), "127.0.0.1:0".into()),
        // Short leases so a killed relay's rows come back within the test.
        ("RELAY_LEASE_SECS".into(), "5".into()),
        ("RELAY_HTTP_TIMEOUT_MS".into(), "2000".into()),
        ("RELAY_BACKOFF_BASE_MS".into(), "100".into()),
        ("RELAY_BACKOFF_MAX_SECS".into(), "3".into()),
        ("RELAY_POLL_INTERVAL_MS".into(), "250".into()),
        ("LOG_FORMAT".into(), "json".into()),
        ("RUST_LOG".into(), "warn".into()),
    ]
}

/// The stack under test: a private cluster (so it can be restarted), two
/// ingests and two relays logged in with least privilege, and a faulty
/// downstream.
struct Stack {
    dir: TempDir,
    cluster: PrivateCluster,
    url: String,
    ingest_url: String,
    relay_url: String,
    downstream: simulator::downstream::RunningDownstream,
    ports: Ports,
    ingests: Vec<Proc>,
    relays: Vec<Proc>,
}

impl Stack {
    async fn start(orders: u64) -> Self {
        let dir = TempDir(std::env::temp_dir().join(format!("chaos-{}", testkit::free_port())));
        std::fs::create_dir_all(&dir.0).unwrap();
        let cluster = PrivateCluster::start().expect("a private cluster");
        let url = cluster.migrated_database("chaos").await.unwrap();
        let client = testkit::TestDb::connect_url(&url).await;
        client
            .execute(
                "INSERT INTO orders (id, payment_id) SELECT n, 'pay_' || n FROM generate_series(1, $1::int8) n",
                &[&(orders as i64)],
            )
            .await
            .unwrap();
        drop(client);
        // The services log in with least privilege, as in production.
        let ingest_url = testkit::login_url(&url, Role::Ingest).await;
        let relay_url = testkit::login_url(&url, Role::Relay).await;

        let downstream = simulator::downstream::spawn(DownstreamConfig {
            faults: Faults {
                latency_ms: Latency::Uniform { low: 1.0, high: 30.0 },
                error_rate: 0.05,
                rate_429: 0.02,
                retry_after_secs: 1,
                reset_rate: 0.01,
                ..Faults::default()
            },
            ..DownstreamConfig::default()
        })
        .await
        .unwrap();

        let ports = Ports {
            ingest: [testkit::free_port(), testkit::free_port()],
            ingest_admin: [testkit::free_port(), testkit::free_port()],
        };
        let mut stack = Self {
            dir,
            cluster,
            url,
            ingest_url,
            relay_url,
            downstream,
            ports,
            ingests: Vec::new(),
            relays: Vec::new(),
        };
        stack.ingests = vec![stack.ingest(0), stack.ingest(1)];
        stack.relays = vec![stack.relay(), stack.relay()];
        let http = testkit::http();
        for port in stack.ports.ingest_admin {
            wait_ready(&http, &format!("http://127.0.0.1:{port}")).await;
        }
        stack
    }

    fn ingest(&self, i: usize) -> Proc {
        Proc::spawn(
            "webhook-ingest",
            &ingest_env(&self.ingest_url, &self.ports, i),
            &self.dir.0,
        )
    }

    fn relay(&self) -> Proc {
        Proc::spawn(
            "outbox-relay",
            &relay_env(&self.relay_url, &self.downstream.url()),
            &self.dir.0,
        )
    }

    /// The simulated provider: `events` payments and refunds at `rate`,
    /// with duplicates (concurrent bursts, late redeliveries), a few for no
    /// order and of types the ingest ignores, to both ingests; what it was
    /// told per event goes to `ack_file`.
    fn provider(&self, events: u64, rate: u64, ack_file: &std::path::Path) -> Proc {
        let env = vec![
            (
                "PROVIDER_TARGET".to_owned(),
                format!(
                    "http://127.0.0.1:{},http://127.0.0.1:{}",
                    self.ports.ingest[0], self.ports.ingest[1]
                ),
            ),
            ("PROVIDER_SECRET".to_owned(), SECRET.to_owned()),
        ];
        let (rate, events) = (rate.to_string(), events.to_string());
        let args = [
            "provider",
            "--rate",
            &rate,
            "--events",
            &events,
            "--orders",
            &events,
            "--duplicate-rate",
            "0.1",
            "--duplicate-delay-ms",
            "0..3000",
            "--late-duplicate-rate",
            "0.3",
            "--late-delay-ms",
            "2000",
            "--burst-rate",
            "0.02",
            "--refund-rate",
            "0.03",
            "--unmatched-rate",
            "0.01",
            "--unknown-rate",
            "0.01",
            "--timeout-ms",
            "3000",
            "--give-up-after-ms",
            "150000",
            "--ack-file",
            ack_file.to_str().unwrap(),
            "--json",
            "--no-progress",
        ];
        Proc::spawn_with_args("simulator", &args, &env, &self.dir.0)
    }

    fn stop_services(&mut self) {
        for p in self.relays.iter_mut().chain(self.ingests.iter_mut()) {
            p.stop(Duration::from_secs(10));
        }
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

/// The provider's summary: it got a 2xx for every event.
fn provider_summary(
    provider: &Proc,
    events: u64,
    tally: &mut Tally,
    progress: &Progress,
) -> serde_json::Value {
    let summary: serde_json::Value = serde_json::from_str(provider.log().lines().last().unwrap_or("{}"))
        .unwrap_or_else(|e| panic!("provider summary: {e}: {}", provider.log()));
    tally.deliveries = summary["deliveries"].as_u64().unwrap();
    tally.duplicates =
        summary["duplicate_deliveries"].as_u64().unwrap() + summary["burst_deliveries"].as_u64().unwrap();
    assert_eq!(
        summary["acknowledged"], summary["events"],
        "the provider got a 2xx for every event: {summary}"
    );
    assert_eq!(summary["events"].as_u64(), Some(events));
    progress.note(&format!(
        "the provider is done: {} events, {} deliveries, every event acknowledged; draining the outbox",
        thousands(events),
        thousands(tally.deliveries)
    ));
    summary
}

/// Waits until no outbox row is pending (the leases of the last killed
/// relay expire in 5 s).
async fn drain(client: &tokio_postgres::Client, stack: &Stack, progress: &mut Progress) {
    let drained = Instant::now();
    loop {
        // A cancelled shipment may keep the lease of a relay killed while
        // its call was under way: that outcome never comes.
        let left = testkit::count(client, "SELECT count(*) FROM outbox WHERE status = 'pending'").await;
        if left == 0 {
            break;
        }
        assert!(
            drained.elapsed() < Duration::from_secs(90),
            "{left} rows still pending or leased"
        );
        if progress.due() {
            let totals = stack.downstream.totals();
            progress.line(
                "draining",
                &format!(
                    "{} outbox rows pending | effects {} (requests {})",
                    thousands(left as u64),
                    thousands(totals.effects),
                    thousands(totals.requests)
                ),
                totals.effects,
                "effects",
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    progress.note("drained; checking every acknowledgement and effect");
}

/// What the provider was told, per event, against the database: every
/// acknowledgement recorded with its status. Returns the acknowledged
/// events and every recorded event's status.
async fn check_acknowledgements(
    client: &tokio_postgres::Client,
    ack_file: &std::path::Path,
    events: u64,
) -> (HashSet<String>, HashMap<String, String>) {
    let acks: Vec<serde_json::Value> = std::fs::read_to_string(ack_file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(acks.len() as u64, events);
    let acknowledged: HashSet<String> = acks
        .iter()
        .filter(|a| a["acknowledged"] == true)
        .map(|a| a["event_id"].as_str().unwrap().to_owned())
        .collect();
    let recorded: HashMap<String, String> = client
        .query("SELECT event_id, status FROM processed_events", &[])
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for ack in &acks {
        let id = ack["event_id"].as_str().unwrap();
        assert_eq!(
            recorded.get(id).map(String::as_str),
            ack["status"].as_str(),
            "{id}: acknowledged with {} but recorded as {:?}",
            ack["status"],
            recorded.get(id)
        );
    }
    (acknowledged, recorded)
}

/// Outbox rows: all finished, each enqueued by an acknowledged event; their
/// effects at the downstream, exactly: one per done row, at most one per
/// cancelled row, none without a row, none doubled.
async fn check_effects(
    client: &tokio_postgres::Client,
    stack: &Stack,
    acknowledged: &HashSet<String>,
    tally: &mut Tally,
) {
    let rows: Vec<(String, String, String)> = client
        .query("SELECT idempotency_key, status, event_id FROM outbox", &[])
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let stats = stack.downstream.stats();
    let keys = stats.keys.as_ref().unwrap();
    for (key, status, event_id) in &rows {
        assert!(
            acknowledged.contains(event_id),
            "{key} enqueued by {event_id}, never acknowledged"
        );
        let effects = keys.get(key).map_or(0, |k| k.effects);
        match status.as_str() {
            "done" => assert_eq!(effects, 1, "{key}: done, so exactly one effect"),
            // Cancelled by a refund: no effect, unless its call was under
            // way at the refund and the downstream did the work but the
            // relay never heard (a timeout, a reset, a kill).
            "cancelled" => assert!(effects <= 1, "{key}: cancelled, {effects} effects"),
            other => panic!("{key} is {other}"),
        }
    }
    let enqueued: HashSet<&str> = rows.iter().map(|(k, _, _)| k.as_str()).collect();
    for (key, k) in keys {
        assert!(
            k.effects == 0 || enqueued.contains(key.as_str()),
            "{key} has an effect but no outbox row"
        );
        assert!(k.effects <= 1, "{key}: {} effects", k.effects);
    }
    tally.requests = stats.requests;
    tally.effects = stats.effects;
    tally.double_effects = stats.double_effects;
    assert_eq!(stats.double_effects, 0);
    let with_effect = |status: &str| {
        rows.iter()
            .filter(|(k, s, _)| s == status && keys.get(k).is_some_and(|k| k.effects == 1))
            .count()
    };
    assert_eq!(
        stats.effects as usize,
        with_effect("done") + with_effect("cancelled")
    );
    assert_eq!(
        with_effect("done"),
        rows.iter().filter(|(_, s, _)| s == "done").count()
    );
    assert!(stats.requests > stats.effects, "the faults made the relays retry");
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
