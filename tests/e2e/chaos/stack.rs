//! What the chaos runs against: a private cluster, two ingests and two
//! relays logged in with least privilege, the faulty downstream, and what
//! the ingests recorded so far.

use super::*;

/// Events and deliveries the ingests recorded so far, read for the
/// progress line on a connection of its own, made again after the Postgres
/// restart (`None` while the server is down).
pub(super) struct Recorded {
    pub(super) database: db::Database,
    pub(super) client: Option<tokio_postgres::Client>,
}

impl Recorded {
    pub(super) fn new(url: &str) -> Self {
        Self {
            database: db::Database::parse(url).unwrap(),
            client: None,
        }
    }

    /// A fresh connection when the last one broke (the restart closes it).
    pub(super) async fn read(&mut self) -> Option<(u64, u64)> {
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

pub(super) struct Ports {
    pub(super) ingest: [u16; 2],
    pub(super) ingest_admin: [u16; 2],
}

pub(super) fn ingest_env(url: &str, ports: &Ports, i: usize) -> Vec<(String, String)> {
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

/// The relays' tuning: leases of 5 s, so a killed relay's rows come back
/// within the test.
pub(super) const RELAY: RelayTuning = RelayTuning {
    lease_secs: 5,
    http_timeout_ms: 2000,
    backoff_base_ms: 100,
    backoff_max_secs: 3,
    poll_interval_ms: 250,
};

/// The stack under test: a private cluster (so it can be restarted), two
/// ingests and two relays logged in with least privilege, and a faulty
/// downstream.
pub(super) struct Stack {
    pub(super) dir: TempDir,
    pub(super) cluster: PrivateCluster,
    pub(super) url: String,
    pub(super) ingest_url: String,
    pub(super) relay_url: String,
    pub(super) downstream: simulator::downstream::RunningDownstream,
    pub(super) ports: Ports,
    pub(super) ingests: Vec<Proc>,
    pub(super) relays: Vec<Proc>,
}

impl Stack {
    pub(super) async fn start(orders: u64) -> Self {
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

    pub(super) fn ingest(&self, i: usize) -> Proc {
        Proc::spawn(
            "webhook-ingest",
            &ingest_env(&self.ingest_url, &self.ports, i),
            &self.dir.0,
        )
    }

    pub(super) fn relay(&self) -> Proc {
        Proc::spawn(
            "outbox-relay",
            &RELAY.env(&self.relay_url, &self.downstream.url()),
            &self.dir.0,
        )
    }

    /// The simulated provider: `events` payments and refunds at `rate`,
    /// with duplicates (concurrent bursts, late redeliveries), a few for no
    /// order and of types the ingest ignores, to both ingests; what it was
    /// told per event goes to `ack_file`.
    pub(super) fn provider(&self, events: u64, rate: u64, ack_file: &std::path::Path) -> Proc {
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

    pub(super) fn stop_services(&mut self) {
        for p in self.relays.iter_mut().chain(self.ingests.iter_mut()) {
            p.stop(Duration::from_secs(10));
        }
    }
}
