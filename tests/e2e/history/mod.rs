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
use crate::harness::{Proc, SECRET, TempDir, try_post_signed, wait_ready};
use crate::progress::{Progress, thousands};

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub(crate) fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as i64
}

/// The relays' HTTP timeout; hung answers take longer.
const HTTP_TIMEOUT_MS: u64 = 800;

const INSTRUMENTATION: &str = r#"
CREATE SEQUENCE history_seq;
CREATE TABLE history_events (
    seq bigint NOT NULL, op text NOT NULL, event_id text NOT NULL, event_type text NOT NULL, order_id bigint,
    status text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE history_outbox (
    seq bigint NOT NULL, op text NOT NULL, order_id bigint NOT NULL, kind text NOT NULL,
    old_status text, new_status text NOT NULL, old_owner text, new_owner text, claimed boolean NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
-- Runs after the claim's INSERT, so after the statement locked the order;
-- and after an unmatched event's application (the reconciler's UPDATE,
-- whose statement locked the order first).
CREATE FUNCTION history_event() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    IF TG_OP = 'INSERT' OR (OLD.status = 'unmatched' AND NEW.status <> 'unmatched') THEN
        INSERT INTO history_events (seq, op, event_id, event_type, order_id, status)
        VALUES (nextval('history_seq'), TG_OP, NEW.event_id, NEW.event_type, NEW.order_id, NEW.status);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER history_event AFTER INSERT OR UPDATE OF status ON processed_events
    FOR EACH ROW EXECUTE FUNCTION history_event();
CREATE FUNCTION history_outbox() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    INSERT INTO history_outbox (seq, op, order_id, kind, old_status, new_status, old_owner, new_owner, claimed)
    VALUES (nextval('history_seq'), TG_OP, NEW.order_id, NEW.kind,
            CASE TG_OP WHEN 'UPDATE' THEN OLD.status END, NEW.status,
            CASE TG_OP WHEN 'UPDATE' THEN OLD.lease_owner END, NEW.lease_owner,
            NEW.leased_until IS NOT NULL
              AND (TG_OP = 'INSERT' OR NEW.leased_until IS DISTINCT FROM OLD.leased_until));
    RETURN NULL;
END $$;
CREATE TRIGGER history_outbox AFTER INSERT OR UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION history_outbox();
"#;

/// One event the provider sends, and how.
#[derive(Debug, Clone)]
struct Planned {
    id: String,
    event_type: &'static str,
    payment_id: String,
    order: Option<i64>,
    /// Delay before its first delivery, from the start of its order's group.
    delay_ms: u64,
    /// Extra deliveries (duplicates), each after this delay.
    duplicates: Vec<u64>,
}

/// When an order is created, if not before the test starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Late {
    /// This long after its group's first send: while its events are in
    /// flight (a few ms), or a second or two later.
    After(u64),
    /// Only after its events aged past retention and the prune ran.
    AfterRetention,
}

/// One order's events, delivered together, and when the order is created
/// when it is not there from the start.
#[derive(Debug, Clone)]
struct Group {
    events: Vec<Planned>,
    create: Option<(i64, Late)>,
}

impl Group {
    fn of(events: Vec<Planned>) -> Self {
        Self { events, create: None }
    }
}

fn late(rng: &mut StdRng, retention: bool) -> Option<Late> {
    let roll: f64 = rng.random();
    if roll < 0.05 {
        Some(Late::After(rng.random_range(0..30)))
    } else if roll < 0.09 {
        Some(Late::After(rng.random_range(800..2500)))
    } else if retention && roll < 0.11 {
        Some(Late::AfterRetention)
    } else {
        None
    }
}

fn plan(rng: &mut StdRng, orders: i64, retained: &HashSet<i64>, retention: bool) -> (Vec<Group>, Vec<Group>) {
    let mut phase1 = Vec::new();
    let mut phase2 = Vec::new();
    let event =
        |rng: &mut StdRng, id: String, event_type: &'static str, order: Option<i64>, payment_id: String| {
            let mut duplicates = Vec::new();
            for _ in 0..3 {
                if rng.random_bool(0.12) {
                    duplicates.push(if rng.random_bool(0.7) {
                        rng.random_range(0..20)
                    } else {
                        rng.random_range(50..400)
                    });
                }
            }
            Planned {
                id,
                event_type,
                payment_id,
                order,
                delay_ms: if rng.random_bool(0.5) {
                    0
                } else {
                    rng.random_range(0..25)
                },
                duplicates,
            }
        };
    for order in 1..=orders {
        let pay = format!("pay_{order}");
        let mut group = Vec::new();
        let mut kinds: Vec<(&str, &'static str)> = Vec::new();
        if rng.random_bool(0.85) {
            kinds.push(("pay", "payment.succeeded"));
        }
        if rng.random_bool(0.45) {
            kinds.push(("refund", "payment.refunded"));
        }
        if rng.random_bool(0.1) {
            kinds.push(("pay2", "payment.succeeded"));
        }
        if rng.random_bool(0.1) {
            kinds.push(("refund2", "payment.refunded"));
        }
        if rng.random_bool(0.1) {
            kinds.push(("update", "payment.updated"));
        }
        for (tag, event_type) in kinds {
            group.push(event(
                rng,
                format!("evt_{tag}_{order}"),
                event_type,
                Some(order),
                pay.clone(),
            ));
        }
        // Refunds that overtake their payment on purpose.
        if rng.random_bool(0.1) {
            for p in &mut group {
                p.delay_ms = if p.event_type == "payment.refunded" { 0 } else { 15 };
            }
        }
        let create = if retained.contains(&order) {
            None
        } else {
            late(rng, retention).map(|l| (order, l))
        };
        phase1.push(Group {
            events: group,
            create,
        });
        if retained.contains(&order) {
            let mut late = Vec::new();
            // The first refund or payment resent after its record was pruned,
            // and a new distinct refund.
            late.push(event(
                rng,
                format!("evt_refund_{order}"),
                "payment.refunded",
                Some(order),
                pay.clone(),
            ));
            late.push(event(
                rng,
                format!("evt_pay_{order}"),
                "payment.succeeded",
                Some(order),
                pay.clone(),
            ));
            late.push(event(
                rng,
                format!("evt_refund3_{order}"),
                "payment.refunded",
                Some(order),
                pay.clone(),
            ));
            phase2.push(Group::of(late));
        }
    }
    // Payment ids no order has.
    for n in 0..orders / 50 {
        let kind = if n % 2 == 0 {
            "payment.succeeded"
        } else {
            "payment.refunded"
        };
        phase1.push(Group::of(vec![event(
            rng,
            format!("evt_stray_{n}"),
            kind,
            None,
            format!("pay_none_{n}"),
        )]));
    }
    (phase1, phase2)
}

/// Which ingest an event's first delivery goes to: a hash of its id, so the
/// distinct events of one order meet in one ingest (and in one of its
/// batches) as often as they are split between the two.
fn spread(id: &str) -> usize {
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (hash >> 32) as usize
}

/// Delivers one event until it gets a 200 (a provider retries on anything
/// else, and on its own timeout), recording every attempt.
async fn deliver(
    http: &reqwest::Client,
    ingests: &[String],
    p: &Planned,
    phase: u8,
    log: &Mutex<Vec<Delivery>>,
) {
    let body = crate::harness::event(&p.id, p.event_type, &p.payment_id);
    let started = Instant::now();
    let mut attempt = 0usize;
    loop {
        let target = &ingests[(attempt + spread(&p.id)) % ingests.len()];
        attempt += 1;
        let sent_us = now_us();
        let result = try_post_signed(http, target, &body, SECRET, &[]).await;
        let (status, outcome) = match result {
            Ok(response) => {
                let status = response.status().as_u16();
                match response.json::<serde_json::Value>().await {
                    Ok(v) => (status, v["status"].as_str().map(str::to_owned)),
                    // The client's timeout ran out while it read the answer
                    // (seen on an overloaded machine): to the provider no
                    // answer came, so it is no acknowledgement, and it retries.
                    Err(_) if status == 200 => (0, None),
                    Err(_) => (status, None),
                }
            }
            Err(_) => (0, None),
        };
        let acked_us = (status == 200).then(now_us);
        log.lock().unwrap().push(Delivery {
            event_id: p.id.clone(),
            phase,
            sent_us,
            acked_us,
            status,
            outcome,
        });
        if status == 200 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{} never got a 200",
            p.id
        );
        tokio::time::sleep(Duration::from_millis(20 + 10 * attempt.min(20) as u64)).await;
    }
}

/// Every order's events at once (each after its own small delay), with its
/// duplicates, and the creation of a late order at its moment; `in_flight`
/// orders at a time, to `stack`'s ingests.
async fn deliver_all(
    stack: &Stack,
    groups: &[Group],
    phase: u8,
    in_flight: usize,
    log: &Mutex<Vec<Delivery>>,
) {
    let (http, ingests, shop) = (&stack.http, stack.targets.as_slice(), &stack.shop);
    futures_util::stream::iter(groups)
        .map(|group| async move {
            let sends = group.events.iter().flat_map(|p| {
                std::iter::once(p.delay_ms)
                    .chain(p.duplicates.iter().copied())
                    .map(move |delay| async move {
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                        deliver(http, ingests, p, phase, log).await;
                    })
            });
            let create = async {
                if let Some((order, Late::After(delay))) = group.create {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    shop.create(order).await;
                }
            };
            tokio::join!(futures_util::future::join_all(sends), create);
        })
        .buffer_unordered(in_flight)
        .collect::<Vec<()>>()
        .await;
}

/// The first ingest runs with a pool of two connections, so its payments
/// wait for connections and are recorded several per statement
/// (`webhook_ingest::record`); the second with the default pool, where they
/// mostly run alone. Both kinds race each other for the same orders.
fn ingest_env(url: &str, port: u16, admin: u16, which: usize) -> Vec<(String, String)> {
    let pool = if which == 0 { "2" } else { "16" };
    vec![
        // Longer than the eight days the retention phase ages events by, so
        // the reconciler still applies those whose order comes after it.
        ("UNMATCHED_HORIZON_HOURS".into(), "240".into()),
        ("DATABASE_POOL_SIZE".into(), pool.into()),
        ("DATABASE_URL".into(), url.into()),
        ("WEBHOOK_SECRETS".into(), SECRET.into()),
        ("INGEST_LISTEN_ADDR".into(), format!("127.0.0.1:{port}")),
        ("ADMIN_LISTEN_ADDR".into(), format!("127.0.0.1:{admin}")),
        ("INGEST_DEADLINE_MS".into(), "3000".into()),
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
        ("RELAY_LEASE_SECS".into(), "3".into()),
        ("RELAY_HTTP_TIMEOUT_MS".into(), HTTP_TIMEOUT_MS.to_string()),
        ("RELAY_BACKOFF_BASE_MS".into(), "50".into()),
        ("RELAY_BACKOFF_MAX_SECS".into(), "1".into()),
        ("RELAY_POLL_INTERVAL_MS".into(), "200".into()),
        ("LOG_FORMAT".into(), "json".into()),
        ("RUST_LOG".into(), "warn".into()),
    ]
}

/// The chaos of a soak run so far, for the progress line.
#[derive(Default)]
struct ChaosSoFar {
    relays_killed: AtomicU64,
    ingests_killed: AtomicU64,
    postgres_restarts: AtomicU64,
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
struct Watched<'a> {
    progress: &'a Mutex<Progress>,
    downstream: &'a RunningDownstream,
    chaos: Option<&'a ChaosSoFar>,
}

impl Watched<'_> {
    fn note(&self, what: &str) {
        self.progress.lock().unwrap().note(what);
    }

    fn line(&self, phase: &str, what: &str, count: u64, unit: &str) {
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
    async fn delivering(
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
    async fn until_drained(&self, client: &tokio_postgres::Client, after: &str, timeout: Duration) {
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
const UNAPPLIED: &str = "SELECT count(*) FROM processed_events pe
    JOIN orders o ON o.payment_id = pe.payload -> 'data' ->> 'payment_id'
    WHERE pe.status = 'unmatched'";

/// Deliveries `groups` plans: each event's first and its duplicates.
fn planned_deliveries(groups: &[Group]) -> u64 {
    groups
        .iter()
        .flat_map(|g| &g.events)
        .map(|p| 1 + p.duplicates.len() as u64)
        .sum()
}

fn merge(into: &mut HashMap<String, KeyRecord>, stats: &simulator::downstream::Stats) {
    for (key, k) in stats.keys.as_ref().expect("stats with keys") {
        let record = into.entry(key.clone()).or_default();
        record.effects += k.effects;
        record.calls.extend(k.calls.iter().cloned());
    }
}

/// The shop's connection, creating late orders: reconnects and retries
/// through a database restart or a failover (an order whose creation
/// committed before its answer was lost is found on the retry).
struct Shop {
    url: String,
    client: tokio::sync::Mutex<Option<Arc<tokio_postgres::Client>>>,
    /// The orders it created, and when each creation had committed.
    created: Mutex<HashMap<i64, i64>>,
}

impl Shop {
    fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            client: tokio::sync::Mutex::new(None),
            created: Mutex::new(HashMap::new()),
        }
    }

    /// Creates order `id`, noting when its creation had certainly committed.
    async fn create(&self, id: i64) {
        let started = Instant::now();
        loop {
            let client = {
                let mut held = self.client.lock().await;
                if held.as_ref().is_none_or(|c| c.is_closed()) {
                    *held = db::Database::parse(&self.url)
                        .unwrap()
                        .connect_with_default_search_path("shop")
                        .await
                        .ok()
                        .map(Arc::new);
                }
                held.clone()
            };
            if let Some(client) = client {
                match client
                    .execute(
                        "INSERT INTO orders (id, payment_id) VALUES ($1::int8, 'pay_' || $1::int8)
                         ON CONFLICT DO NOTHING",
                        &[&id],
                    )
                    .await
                {
                    Ok(_) => {
                        self.created.lock().unwrap().insert(id, now_us());
                        return;
                    }
                    Err(e) if started.elapsed() > Duration::from_secs(90) => {
                        panic!("order {id} could not be created: {e:?}")
                    }
                    Err(_) => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// How far behind the primary its standby is when the primary dies: its WAL
/// senders are stopped this long first (testkit's
/// `kill_primary_with_standby_behind`), as a busy network or a slow standby
/// leaves an asynchronous one. A synchronous standby is never behind what
/// was acknowledged: those commits wait, and get no 200.
const STANDBY_BEHIND: Duration = Duration::from_millis(300);

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

pub(crate) struct Run {
    pub report: check::Report,
    /// Distinct events the provider holds a 200 for.
    pub acknowledged: usize,
    /// Of those, the ones not on the (new) primary at the end.
    pub lost: Vec<String>,
    pub failover: Option<Failover>,
}

fn micros(us: i64) -> Duration {
    Duration::from_micros(us.max(0) as u64)
}

/// The longest gap between two 200s the provider received that contains
/// `at` (unix us).
fn window_without_200(deliveries: &[Delivery], at: i64) -> Duration {
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

/// One run's histories: what the provider sends in each phase.
struct Histories {
    /// Every order's events, the stray payments, and the late orders'
    /// creations.
    phase1: Vec<Group>,
    /// After retention: resends and new refunds of the retained orders.
    phase2: Vec<Group>,
    /// Orders whose rows and events age past retention and are pruned.
    retained: HashSet<i64>,
    /// Every event of both phases: id -> (type, order it names).
    planned: HashMap<String, (String, Option<i64>)>,
    /// Orders created after their first events were sent.
    late: HashSet<i64>,
}

/// The histories of `seed`: a failing seed replays the same histories.
fn generate_histories(orders: i64, seed: u64, retention: bool) -> Histories {
    let mut rng = StdRng::seed_from_u64(seed);
    let retained: HashSet<i64> = if retention {
        (1..=orders).filter(|_| rng.random_bool(0.05)).collect()
    } else {
        HashSet::new()
    };
    let (phase1, phase2) = plan(&mut rng, orders, &retained, retention);
    let planned = phase1
        .iter()
        .chain(&phase2)
        .flat_map(|g| &g.events)
        .map(|p| (p.id.clone(), (p.event_type.to_owned(), p.order)))
        .collect();
    let late = phase1.iter().filter_map(|g| g.create.map(|(o, _)| o)).collect();
    Histories {
        phase1,
        phase2,
        retained,
        planned,
        late,
    }
}

impl Histories {
    /// Orders created only after their events aged past retention.
    fn created_after_retention(&self) -> Vec<i64> {
        self.phase1
            .iter()
            .filter_map(|g| match g.create {
                Some((order, Late::AfterRetention)) => Some(order),
                _ => None,
            })
            .collect()
    }
}

/// What a history is delivered to, and the provider's and the shop's ends
/// of it; the processes are apart ([`Processes`]), as the chaos replaces them.
struct Stack {
    url: String,
    ingest_url: String,
    relay_url: String,
    downstream: RunningDownstream,
    /// The ingests' listening and admin ports.
    ports: [u16; 2],
    admins: [u16; 2],
    /// The ingests' base URLs, for the provider.
    targets: Vec<String>,
    http: reqwest::Client,
    shop: Shop,
    /// Where the services write their output; removed last.
    dir: TempDir,
}

impl Stack {
    fn spawn_ingest(&self, which: usize) -> Proc {
        Proc::spawn(
            "webhook-ingest",
            &ingest_env(&self.ingest_url, self.ports[which], self.admins[which], which),
            &self.dir.0,
        )
    }

    fn spawn_relay(&self) -> Proc {
        Proc::spawn(
            "outbox-relay",
            &relay_env(&self.relay_url, &self.downstream.url()),
            &self.dir.0,
        )
    }
}

/// The two ingests and two relays.
struct Processes {
    ingests: Vec<Proc>,
    relays: Vec<Proc>,
}

impl Processes {
    /// A SIGTERM to each, relays first, each given 10 s to finish.
    fn stop(&mut self) {
        for relay in &mut self.relays {
            relay.stop(Duration::from_secs(10));
        }
        for ingest in &mut self.ingests {
            ingest.stop(Duration::from_secs(10));
        }
    }
}

/// A migrated database with the checker's triggers and the orders there
/// from the start, the downstream with its faults, and two ingests and two
/// relays, ready.
async fn start_stack(cluster: &Cluster<'_>, orders: i64, late: &HashSet<i64>) -> (Stack, Processes) {
    let dir = TempDir(std::env::temp_dir().join(format!("history-{}", testkit::free_port())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let url = match cluster {
        Cluster::Private(c) => c.migrated_database("history").await.unwrap(),
        Cluster::Ha(c) => c.migrated_database("history").await.unwrap(),
    };
    let client = testkit::TestDb::connect_url(&url).await;
    client.batch_execute(INSTRUMENTATION).await.unwrap();
    let present: Vec<i64> = (1..=orders).filter(|o| !late.contains(o)).collect();
    client
        .execute(
            "INSERT INTO orders (id, payment_id) SELECT n, 'pay_' || n FROM unnest($1::int8[]) n",
            &[&present],
        )
        .await
        .unwrap();
    let downstream = simulator::downstream::spawn(DownstreamConfig {
        faults: Faults {
            latency_ms: Latency::Uniform { low: 1.0, high: 15.0 },
            error_rate: 0.05,
            rate_429: 0.02,
            retry_after_secs: 1,
            reset_rate: 0.02,
            hang_rate: 0.02,
            hang_ms: 2 * HTTP_TIMEOUT_MS,
        },
        ..DownstreamConfig::default()
    })
    .await
    .unwrap();
    let ports = [testkit::free_port(), testkit::free_port()];
    let _ = testkit::http(); // installs the TLS provider
    let stack = Stack {
        ingest_url: testkit::login_url(&url, Role::Ingest).await,
        relay_url: testkit::login_url(&url, Role::Relay).await,
        shop: Shop::new(&url),
        url,
        downstream,
        ports,
        admins: [testkit::free_port(), testkit::free_port()],
        targets: ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect(),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .pool_max_idle_per_host(64)
            .build()
            .unwrap(),
        dir,
    };
    let processes = Processes {
        ingests: (0..2).map(|i| stack.spawn_ingest(i)).collect(),
        relays: (0..2).map(|_| stack.spawn_relay()).collect(),
    };
    for admin in stack.admins {
        wait_ready(&stack.http, &format!("http://127.0.0.1:{admin}")).await;
    }
    (stack, processes)
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

/// The primary's death and the promotion that followed, as they happened.
struct PrimaryKilled {
    killed: testkit::HaNode,
    promoted: testkit::HaNode,
    kill_us: i64,
    promoted_after: Duration,
    saw_unready: bool,
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

    /// A third of the way through phase 1's deliveries, the primary's
    /// postmaster SIGKILLed with its standby behind; then until a standby is
    /// promoted, an ingest's readiness watched.
    async fn kill_the_primary(&self, ha: &testkit::HaCluster, planned1: u64) -> PrimaryKilled {
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

    /// Retention, then phase 2: resends and new refunds of the retained
    /// orders. Returns the events whose records the prune removed.
    async fn retention_then_phase2(
        &self,
        client: &tokio_postgres::Client,
        in_flight: usize,
        histories: &Histories,
        keys: &mut HashMap<String, KeyRecord>,
    ) -> HashSet<String> {
        // The downstream forgets its keys below, as a real email API does
        // after retention: what it held so far is kept here.
        merge(keys, &self.stack.downstream.stats());
        let pruned = self.age_and_prune(client, histories).await;
        // The orders come at last; the reconciler applies their events by itself.
        for order in histories.created_after_retention() {
            self.stack.shop.create(order).await;
        }
        let reset = self
            .stack
            .http
            .post(format!("{}/control/reset", self.stack.downstream.url()))
            .send()
            .await
            .unwrap();
        assert!(reset.status().is_success());

        let phase2 = &histories.phase2;
        let planned2 = planned_deliveries(phase2);
        self.watched.note(&format!(
            "phase 2: {} resends and new refunds of the {} retained orders, {} deliveries",
            thousands(phase2.iter().map(|g| g.events.len() as u64).sum()),
            thousands(phase2.len() as u64),
            thousands(planned2)
        ));
        self.watched
            .delivering(
                2,
                planned2,
                &self.log,
                deliver_all(self.stack, phase2, 2, in_flight, &self.log),
            )
            .await;
        // The reconciler looks at events older than 15 minutes once a minute.
        self.watched
            .until_drained(client, "phase 2", Duration::from_secs(180))
            .await;
        pruned
    }

    /// The retained orders' rows and events age eight days and are pruned.
    /// The events of the orders still to come age with them: the prune must
    /// keep them. Returns the events whose records it removed.
    async fn age_and_prune(&self, client: &tokio_postgres::Client, histories: &Histories) -> HashSet<String> {
        let retained_ids: Vec<String> = histories
            .phase1
            .iter()
            .flat_map(|g| &g.events)
            .filter(|p| p.order.is_some_and(|o| histories.retained.contains(&o)))
            .map(|p| p.id.clone())
            .collect();
        let early_ids: Vec<String> = histories
            .phase1
            .iter()
            .filter(|g| matches!(g.create, Some((_, Late::AfterRetention))))
            .flat_map(|g| &g.events)
            .filter(|p| p.event_type != "payment.updated")
            .map(|p| p.id.clone())
            .collect();
        let retained_orders: Vec<i64> = histories.retained.iter().copied().collect();
        self.watched.note(&format!(
            "retention: {} orders' rows and {} events aged eight days, with {} unmatched events of {} orders still to come, then outbox-relay prune",
            thousands(retained_orders.len() as u64),
            thousands(retained_ids.len() as u64),
            thousands(early_ids.len() as u64),
            thousands(histories.created_after_retention().len() as u64)
        ));
        client
            .execute(
                "UPDATE outbox SET created_at = now() - interval '8 days', finished_at = now() - interval '8 days'
                  WHERE order_id = ANY($1)",
                &[&retained_orders],
            )
            .await
            .unwrap();
        let aged: Vec<String> = retained_ids.iter().chain(&early_ids).cloned().collect();
        client
            .execute(
                "UPDATE processed_events SET processed_at = now() - interval '8 days' WHERE event_id = ANY($1)",
                &[&aged],
            )
            .await
            .unwrap();
        let prune = std::process::Command::new(testkit::bin::path("outbox-relay"))
            .arg("prune")
            .env("DATABASE_URL", &self.stack.relay_url)
            .env("RETENTION_DAYS", "7")
            .env("FULFILMENT_URL", self.stack.downstream.url())
            .env("EMAIL_URL", self.stack.downstream.url())
            .output()
            .unwrap();
        assert!(prune.status.success(), "{prune:?}");
        assert_eq!(
            testkit::count(
                client,
                &format!(
                    "SELECT count(*) FROM outbox WHERE order_id IN ({})",
                    retained_orders
                        .iter()
                        .map(i64::to_string)
                        .chain(std::iter::once("0".into()))
                        .collect::<Vec<_>>()
                        .join(",")
                )
            )
            .await,
            0,
            "the prune removed the retained orders' rows"
        );
        let kept: i64 = client
            .query_one(
                "SELECT count(*) FROM processed_events WHERE event_id = ANY($1) AND status = 'unmatched'",
                &[&early_ids],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            kept as usize,
            early_ids.len(),
            "the prune kept every unmatched event past retention"
        );
        retained_ids.into_iter().collect()
    }

    /// The histories went through batches (else this test proves nothing of
    /// them). After a chaos run's SIGKILL the first ingest's counters
    /// restart, so they are read from both.
    async fn assert_some_deliveries_batched(&self) {
        let mut batched = 0.0;
        for admin in self.stack.admins {
            let metrics =
                crate::harness::metrics(&self.stack.http, &format!("http://127.0.0.1:{admin}")).await;
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

/// Until the relays' LISTEN connections found the new primary (their claims
/// alone would also come from polling).
async fn until_both_relays_listen(client: &tokio_postgres::Client, watched: &Watched<'_>) {
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

/// What the checker reads from the database once everything stopped.
struct Collected {
    claims: Vec<Claim>,
    writes: Vec<RowWrite>,
    orders: HashMap<i64, String>,
    rows: HashMap<(String, i64), String>,
}

/// The triggers' records, the orders' final states and the final outbox
/// rows; a claim drawn after `phase1_end` belongs to phase 2.
async fn collect_from_database(client: &tokio_postgres::Client, phase1_end: i64) -> Collected {
    let claims = client
        .query(
            "SELECT seq, op, event_id, event_type, order_id, status,
                    (extract(epoch FROM at) * 1000000)::int8 FROM history_events",
            &[],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| Claim {
            seq: r.get(0),
            op: r.get(1),
            event_id: r.get(2),
            event_type: r.get(3),
            order_id: r.get(4),
            status: r.get(5),
            at_us: r.get(6),
            phase: if r.get::<_, i64>(0) <= phase1_end { 1 } else { 2 },
        })
        .collect();
    let writes = client
        .query(
            "SELECT seq, order_id, kind, op, old_status, new_status, old_owner, new_owner, claimed,
                    (extract(epoch FROM at) * 1000000)::int8 FROM history_outbox",
            &[],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| RowWrite {
            seq: r.get(0),
            order_id: r.get(1),
            kind: r.get(2),
            op: r.get(3),
            old_status: r.get(4),
            new_status: r.get(5),
            old_owner: r.get(6),
            new_owner: r.get(7),
            claimed: r.get(8),
            at_us: r.get(9),
        })
        .collect();
    let orders = client
        .query("SELECT id, status FROM orders", &[])
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let rows = client
        .query("SELECT kind, order_id, status FROM outbox", &[])
        .await
        .unwrap()
        .into_iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect();
    Collected {
        claims,
        writes,
        orders,
        rows,
    }
}

/// Every event the provider holds a 200 for (and retention did not prune)
/// is on the primary now: how many distinct events, and those missing.
async fn acknowledged_but_lost(
    client: &tokio_postgres::Client,
    deliveries: &[Delivery],
    pruned: &HashSet<String>,
) -> (usize, Vec<String>) {
    let acknowledged: Vec<String> = deliveries
        .iter()
        .filter(|d| d.status == 200 && !pruned.contains(&d.event_id))
        .map(|d| d.event_id.clone())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let found: HashSet<String> = client
        .query(
            "SELECT event_id FROM processed_events WHERE event_id = ANY($1)",
            &[&acknowledged],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    let mut lost: Vec<String> = acknowledged
        .iter()
        .filter(|id| !found.contains(*id))
        .cloned()
        .collect();
    lost.sort();
    (acknowledged.len(), lost)
}

impl PrimaryKilled {
    /// The failover as the evidence shows it: how long without a 200, and
    /// until the relays claimed and called again.
    fn measured(
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
