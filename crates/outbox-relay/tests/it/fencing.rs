//! Fencing tokens that never repeat, and poison rows: the claim and
//! completion statements as the relay runs them, as the relay's role.

use std::time::Duration;

use outbox_relay::storage::{self, RowVerdict, Verdict};

use crate::helpers::{Env, env};

fn pool(env: &Env) -> db::Pool {
    db::Database::parse(&env.relay_url)
        .unwrap()
        .pool(&db::ConnectOptions {
            application_name: "fencing-test",
            statement_timeout: Some(Duration::from_secs(5)),
            lock_timeout: None,
            abort_when_client_leaves: false,
            asynchronous_commit: false,
            generic_plans: false,
            index_paths: false,
            pool_size: 1,
            pool_wait: Duration::from_secs(5),
        })
}

const SHORT: Duration = Duration::from_millis(100);
const LONG: Duration = Duration::from_secs(60);

async fn claim_one(client: &db::Client, owner: &str, lease: Duration) -> Option<storage::ClaimedRow> {
    let mut rows = storage::claim_due_batch(client, 10, owner, lease, 25, None)
        .await
        .unwrap();
    assert!(rows.len() <= 1);
    rows.pop()
}

/// Relay `a` stalls past its lease; `b` claims the row and gives up on it
/// (dead); an operator requeues it (attempts back to 0); `a` claims it again,
/// so owner and attempt number are those of `a`'s first claim. The verdict
/// of that first claim, arriving now, must not be taken for the new one's.
#[tokio::test]
async fn a_stale_claims_outcome_never_matches_a_later_claim_even_after_a_requeue() {
    let env = env().await;
    let id = env.enqueue("ship_order", 1, "evt_1").await;
    let pool = pool(&env);
    let client = pool.get().await.unwrap();

    let stale = claim_one(&client, "relay-a", SHORT).await.expect("claimed");
    tokio::time::sleep(SHORT * 2).await;
    let other = claim_one(&client, "relay-b", LONG)
        .await
        .expect("claimed again once the lease ran out");
    let recorded = storage::record_verdicts(
        &client,
        "relay-b",
        &[RowVerdict {
            id,
            claim: other.claim,
            verdict: Verdict::Dead {
                error: "HTTP 400: no".into(),
            },
        }],
    )
    .await
    .unwrap();
    assert_eq!(recorded.len(), 1);
    assert_eq!(requeue(&client, id).await, 1);
    let current = claim_one(&client, "relay-a", LONG)
        .await
        .expect("claimed after the requeue");
    assert_eq!(
        current.attempt, stale.attempt,
        "attempts were reset by the requeue"
    );

    let recorded = storage::record_verdicts(
        &client,
        "relay-a",
        &[RowVerdict {
            id,
            claim: stale.claim,
            verdict: Verdict::Done,
        }],
    )
    .await
    .unwrap();
    assert!(recorded.is_empty(), "the stale claim's verdict was recorded");
    assert_eq!(
        env.row_status(id).await.0,
        "pending",
        "still held by the current claim"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM outbox WHERE lease_owner = 'relay-a'")
            .await,
        1
    );

    // The current claim's own verdict is recorded.
    let recorded = storage::record_verdicts(
        &client,
        "relay-a",
        &[RowVerdict {
            id,
            claim: current.claim,
            verdict: Verdict::Done,
        }],
    )
    .await
    .unwrap();
    assert_eq!(recorded.len(), 1);
    assert_eq!(env.row_status(id).await.0, "done");
}

/// A row whose every claim ends with the relay gone (killed, crashed, stalled
/// past its lease) is dead-lettered after `RELAY_MAX_ATTEMPTS` claims instead
/// of being claimed for ever; other rows are unaffected.
#[tokio::test]
async fn a_row_that_takes_its_relay_down_on_every_claim_goes_dead_after_max_attempts() {
    let env = env().await;
    let poison = env.enqueue("ship_order", 1, "evt_1").await;
    let pool = pool(&env);
    let client = pool.get().await.unwrap();
    const MAX: u32 = 3;

    for n in 1..=MAX {
        let rows = storage::claim_due_batch(&client, 10, "doomed", SHORT, MAX, None)
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "claim {n}");
        assert_eq!(rows[0].attempt, n as i32);
        // The relay dies holding it: no outcome, the lease runs out.
        tokio::time::sleep(SHORT * 2).await;
    }
    let healthy = env.enqueue("send_confirmation", 2, "evt_2").await;
    let rows = storage::claim_due_batch(&client, 10, "next", LONG, MAX, None)
        .await
        .unwrap();
    assert_eq!(
        rows.iter().map(|r| r.id).collect::<Vec<_>>(),
        [healthy],
        "the poison row was handed out again"
    );
    let (status, attempts, error) = env.row_status(poison).await;
    assert_eq!((status.as_str(), attempts), ("dead", MAX as i32));
    let error = error.unwrap_or_default();
    assert!(error.contains("claimed 3 times"), "{error}");
    let dead = storage::dead_rows(
        &client,
        &storage::DeadFilter {
            kind: None,
            limit: 100,
            after: None,
        },
    )
    .await
    .unwrap()
    .rows;
    assert_eq!(dead.iter().map(|d| d.id).collect::<Vec<_>>(), [poison]);

    // Requeued by an operator, it gets RELAY_MAX_ATTEMPTS claims again.
    assert_eq!(requeue(&client, poison).await, 1);
    let rows = storage::claim_due_batch(&client, 10, "next", LONG, MAX, None)
        .await
        .unwrap();
    assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), [poison]);
}

/// A relay process stalls (SIGSTOP) with a call in flight until its lease is
/// long gone; another relay claims the row and records it done. Resumed, the
/// first relay's outcome belongs to a stale claim: dropped, and not counted
/// in its dispatch metrics either.
#[tokio::test]
async fn a_relay_that_stalled_past_its_lease_records_and_counts_nothing() {
    let env = env().await;
    env.set_latency("300").await;
    let id = env.enqueue("ship_order", 1, "evt_1").await;
    let log = std::env::temp_dir().join(format!("stalled-relay-{}.log", testkit::free_port()));
    let admin = format!("127.0.0.1:{}", testkit::free_port());
    let url = env.url();
    let stalled = crate::helpers::RelayProcess(
        std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
            .env("DATABASE_URL", &env.relay_url)
            .env("FULFILMENT_URL", &url)
            .env("EMAIL_URL", &url)
            .env("ADMIN_LISTEN_ADDR", &admin)
            .env("RELAY_LEASE_SECS", "2")
            .env("RELAY_HTTP_TIMEOUT_MS", "1500")
            .env("LOG_FORMAT", "json")
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let started = std::time::Instant::now();
    while env
        .stats()
        .await
        .keys
        .as_ref()
        .and_then(|k| k.get("ship-1"))
        .is_none_or(|k| k.requests == 0)
    {
        assert!(started.elapsed() < Duration::from_secs(10), "never called");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stalled.signal("STOP");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let _other = env.spawn_relay(&[]);
    env.wait_for(
        "SELECT count(*) FROM outbox WHERE status = 'done'",
        1,
        Duration::from_secs(10),
    )
    .await;
    stalled.signal("CONT");
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("no longer ours")
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the stalled relay never tried to record: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = testkit::metrics::Metrics::fetch(&env.http, &format!("http://{admin}"))
        .await
        .unwrap();
    let counted: f64 = ["done", "retry", "dead"]
        .iter()
        .map(|o| metrics.get("outbox_dispatch_total", &[("kind", "ship_order"), ("outcome", o)]))
        .sum();
    assert_eq!(counted, 0.0, "the stale outcome was counted");
    let (status, attempts, _) = env.row_status(id).await;
    assert_eq!((status.as_str(), attempts), ("done", 2));
    let _ = std::fs::remove_file(&log);
}

/// `dead requeue <id>`: how many rows it put back.
async fn requeue(client: &db::Client, id: i64) -> usize {
    let filter = storage::RequeueFilter {
        id: Some(id),
        ..Default::default()
    };
    storage::requeue_dead(client, &filter).await.unwrap().len()
}
