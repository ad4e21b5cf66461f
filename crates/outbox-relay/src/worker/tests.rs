//! A panic while sending, contained: driven through the real loop and
//! the real `relay_once`, against Postgres and the simulated downstream,
//! with a row's work that panics in place of [`Relay::send_or_release`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use clap::Parser as _;
use futures_util::FutureExt as _;
use tokio_util::sync::CancellationToken;

use super::row::Settled;
use super::{Pass, Relay};
use crate::metrics::{DispatchLabels, RelayMetrics};
use crate::storage::ClaimedRow;

struct Env {
    _db: testkit::TestDb,
    client: tokio_postgres::Client,
    downstream: simulator::downstream::RunningDownstream,
    relay: Arc<Relay>,
}

/// A fresh database with `rows` due shipments and a relay (logging in as
/// the relay's role) with `flags` on top of this environment's.
async fn env(rows: i64, flags: &[&str]) -> Env {
    let db = testkit::TestDb::new().await;
    let client = db.client().await;
    client
        .execute(
            "INSERT INTO outbox (kind, payload, idempotency_key, event_id, order_id)
             SELECT 'ship_order', jsonb_build_object('v', 1, 'order_id', o, 'event_id', 'evt_' || o),
                    'ship-' || o, 'evt_' || o, o
               FROM generate_series(1, $1::int8) AS o",
            &[&rows],
        )
        .await
        .unwrap();
    let downstream = simulator::downstream::spawn(Default::default()).await.unwrap();
    let (database_url, url) = (db.url_as(testkit::Role::Relay), downstream.url());
    let mut args = vec![
        "outbox-relay",
        "--database-url",
        &database_url,
        "--fulfilment-url",
        &url,
        "--email-url",
        &url,
    ];
    args.extend_from_slice(flags);
    let settings = crate::config::Cli::try_parse_from(args).unwrap().settings;
    let pool = settings.database().unwrap().pool(&db::ConnectOptions {
        application_name: "outbox-relay-unit-test",
        statement_timeout: None,
        lock_timeout: None,
        abort_when_client_leaves: false,
        asynchronous_commit: true,
        generic_plans: false,
        index_paths: false,
        pool_size: 4,
        pool_wait: Duration::from_secs(5),
    });
    let metrics = RelayMetrics::register(&mut prometheus_client::registry::Registry::default());
    let span_server = settings.database().unwrap().span_server();
    let relay = Relay::new(pool, span_server, settings.relay().unwrap(), metrics).unwrap();
    Env {
        _db: db,
        client,
        downstream,
        relay: Arc::new(relay),
    }
}

impl Env {
    async fn count(&self, sql: &str) -> i64 {
        testkit::count(&self.client, sql).await
    }

    fn retries_counted(&self) -> u64 {
        self.relay
            .metrics
            .dispatches
            .get_or_create(&DispatchLabels {
                kind: "ship_order",
                outcome: "retry",
            })
            .get()
    }
}

/// The first `n` sends panic; the rest are real.
fn panicking_first(
    n: usize,
) -> (
    Arc<AtomicUsize>,
    impl Fn(Arc<Relay>, ClaimedRow) -> futures_util::future::BoxFuture<'static, Settled> + Clone + Send + 'static,
) {
    let panics = Arc::new(AtomicUsize::new(0));
    let counted = panics.clone();
    let work = move |relay: Arc<Relay>, row: ClaimedRow| {
        let counted = counted.clone();
        async move {
            if counted.fetch_add(1, Ordering::SeqCst) < n {
                panic!("injected fault for row {}", row.id);
            }
            relay.send_or_release(row).await
        }
        .boxed()
    };
    (panics, work)
}

/// One call slot and one batch: the loop holds at most two rows, so two
/// panics that never gave their room back would stop it claiming.
#[tokio::test]
async fn the_loop_keeps_claiming_after_sends_panic() {
    let env = env(
        6,
        &[
            "--relay-concurrency",
            "1",
            "--relay-batch-size",
            "1",
            "--relay-poll-interval-ms",
            "50",
            "--relay-backoff-base-ms",
            "10",
            "--relay-backoff-max-secs",
            "1",
        ],
    )
    .await;
    let (_, work) = panicking_first(3);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(env.relay.clone().run_with(shutdown.clone(), work));

    testkit::wait_for_count(
        &env.client,
        "SELECT count(*) FROM outbox WHERE status = 'done'",
        6,
        Duration::from_secs(20),
    )
    .await;
    // The three panicked attempts were recorded as failed attempts and
    // retried: nine attempts for six rows, six calls at the downstream.
    assert_eq!(env.count("SELECT sum(attempts)::int8 FROM outbox").await, 9);
    assert_eq!(env.downstream.stats().requests, 6);
    assert_eq!(env.retries_counted(), 3);
    // Every held row reached the recorder: the loop stops cleanly.
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the loop stops once everything it held is recorded")
        .unwrap();
    assert_eq!(
        env.count("SELECT count(*) FROM outbox WHERE lease_owner IS NOT NULL")
            .await,
        0
    );
}

#[tokio::test]
async fn relay_once_records_a_panicked_row_as_a_retry_and_the_rest_as_sent() {
    let env = env(3, &["--relay-backoff-base-ms", "60000"]).await;
    let (panics, work) = panicking_first(1);
    let pass = env
        .relay
        .relay_once_with(|row| work(env.relay.clone(), row))
        .await
        .unwrap();
    assert_eq!(pass, Pass::Relayed(3));
    assert_eq!(panics.load(Ordering::SeqCst), 3);
    let rows = env
        .client
        .query(
            "SELECT status, attempts, last_error, lease_owner IS NULL AS released,
                    available_at > now() AS backed_off
               FROM outbox ORDER BY status",
            &[],
        )
        .await
        .unwrap();
    let statuses: Vec<String> = rows.iter().map(|r| r.get("status")).collect();
    assert_eq!(statuses, ["done", "done", "pending"]);
    let panicked = &rows[2];
    assert_eq!(panicked.get::<_, i32>("attempts"), 1);
    let error: String = panicked.get("last_error");
    assert!(
        error.starts_with("relay panicked while dispatching: injected fault for row "),
        "{error}"
    );
    assert!(panicked.get::<_, bool>("released"), "no longer leased");
    assert!(panicked.get::<_, bool>("backed_off"), "retried after a backoff");
    assert_eq!(env.downstream.stats().requests, 2);
}

#[tokio::test]
async fn a_panic_on_the_last_allowed_attempt_is_dead() {
    let env = env(1, &["--relay-max-attempts", "1"]).await;
    let (_, work) = panicking_first(1);
    env.relay
        .relay_once_with(|row| work(env.relay.clone(), row))
        .await
        .unwrap();
    let row = env
        .client
        .query_one("SELECT status, last_error FROM outbox", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>("status"), "dead");
    let error: String = row.get("last_error");
    assert!(
        error.contains("1 attempts") && error.contains("relay panicked while dispatching"),
        "{error}"
    );
}

/// Most claims start just before the earliest row of the last claim (see
/// `ClaimFloor`); a row due long before that (committed late, its lease
/// expired, released unsent) is found by the next claim from the start,
/// once per poll interval, however often NOTIFYs wake the relay meanwhile.
#[tokio::test]
async fn a_row_due_before_the_claim_floor_is_still_sent() {
    let env = env(1, &["--relay-poll-interval-ms", "1000"]).await;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(env.relay.clone().run(shutdown.clone()));
    let done = "SELECT count(*) FROM outbox WHERE status = 'done'";
    testkit::wait_for_count(&env.client, done, 1, Duration::from_secs(20)).await;
    env.client
        .batch_execute(
            "INSERT INTO outbox (kind, payload, idempotency_key, event_id, order_id, available_at)
             VALUES ('ship_order', '{\"v\": 1, \"order_id\": 2, \"event_id\": \"evt_2\"}', 'ship-2', 'evt_2', 2,
                     now() - interval '1 hour'),
                    ('ship_order', '{\"v\": 1, \"order_id\": 3, \"event_id\": \"evt_3\"}', 'ship-3', 'evt_3', 3,
                     now())",
        )
        .await
        .unwrap();
    let waker = env.relay.waker();
    let wake = tokio::spawn(async move {
        loop {
            waker.notify_one();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    testkit::wait_for_count(&env.client, done, 3, Duration::from_secs(20)).await;
    wake.abort();
    assert_eq!(env.downstream.stats().effects, 3);
    shutdown.cancel();
    running.await.unwrap();
}
