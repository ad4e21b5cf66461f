//! What a history runs against: the instrumented database, the two
//! ingests and two relays, the faulty downstream, the provider's deliveries
//! and the shop that creates late orders.

use super::*;

/// The relays' HTTP timeout; hung answers take longer.
pub(super) const HTTP_TIMEOUT_MS: u64 = 800;

pub(super) const INSTRUMENTATION: &str = r#"
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

/// Which ingest an event's first delivery goes to: a hash of its id, so the
/// distinct events of one order meet in one ingest (and in one of its
/// batches) as often as they are split between the two.
pub(super) fn spread(id: &str) -> usize {
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (hash >> 32) as usize
}

/// Delivers one event until it gets a 200 (a provider retries on anything
/// else, and on its own timeout), recording every attempt.
pub(super) async fn deliver(
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
pub(super) async fn deliver_all(
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
pub(super) fn ingest_env(url: &str, port: u16, admin: u16, which: usize) -> Vec<(String, String)> {
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

/// The relays' tuning: leases of 3 s and fast backoff against the faulty
/// downstream.
pub(super) const RELAY: RelayTuning = RelayTuning {
    lease_secs: 3,
    http_timeout_ms: HTTP_TIMEOUT_MS,
    backoff_base_ms: 50,
    backoff_max_secs: 1,
    poll_interval_ms: 200,
};

/// The shop's connection, creating late orders: reconnects and retries
/// through a database restart or a failover (an order whose creation
/// committed before its answer was lost is found on the retry).
pub(super) struct Shop {
    pub(super) url: String,
    pub(super) client: tokio::sync::Mutex<Option<Arc<tokio_postgres::Client>>>,
    /// The orders it created, and when each creation had committed.
    pub(super) created: Mutex<HashMap<i64, i64>>,
}

impl Shop {
    pub(super) fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            client: tokio::sync::Mutex::new(None),
            created: Mutex::new(HashMap::new()),
        }
    }

    /// Creates order `id`, noting when its creation had certainly committed.
    pub(super) async fn create(&self, id: i64) {
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

/// What a history is delivered to, and the provider's and the shop's ends
/// of it; the processes are apart ([`Processes`]), as the chaos replaces them.
pub(super) struct Stack {
    pub(super) url: String,
    pub(super) ingest_url: String,
    pub(super) relay_url: String,
    pub(super) downstream: RunningDownstream,
    /// The ingests' listening and admin ports.
    pub(super) ports: [u16; 2],
    pub(super) admins: [u16; 2],
    /// The ingests' base URLs, for the provider.
    pub(super) targets: Vec<String>,
    pub(super) http: reqwest::Client,
    pub(super) shop: Shop,
    /// Where the services write their output; removed last.
    pub(super) dir: TempDir,
}

impl Stack {
    pub(super) fn spawn_ingest(&self, which: usize) -> Proc {
        Proc::spawn(
            "webhook-ingest",
            &ingest_env(&self.ingest_url, self.ports[which], self.admins[which], which),
            &self.dir.0,
        )
    }

    pub(super) fn spawn_relay(&self) -> Proc {
        Proc::spawn(
            "outbox-relay",
            &RELAY.env(&self.relay_url, &self.downstream.url()),
            &self.dir.0,
        )
    }
}

/// The two ingests and two relays.
pub(super) struct Processes {
    pub(super) ingests: Vec<Proc>,
    pub(super) relays: Vec<Proc>,
}

impl Processes {
    /// A SIGTERM to each, relays first, each given 10 s to finish.
    pub(super) fn stop(&mut self) {
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
pub(super) async fn start_stack(
    cluster: &Cluster<'_>,
    orders: i64,
    late: &HashSet<i64>,
) -> (Stack, Processes) {
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
