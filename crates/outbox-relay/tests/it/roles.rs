//! Least privilege: the `outbox_relay` role (migrations/V2__roles.sql,
//! V8__prune_by_ctid.sql) holds what the relay and its operator commands
//! use, and `outbox_monitor` what the autoscaler's count of due rows uses.
//! Everything else is refused, and every grant is needed: revoke any one and
//! a statement fails. (Every other test of this crate runs the relay as a
//! member of its role.)

use std::time::Duration;

use outbox_relay::storage::{self, RowVerdict, Verdict};
use testkit::{Role, TestDb, assert_refused, grants_of, is_refused};
use tokio_postgres::error::SqlState;

use crate::helpers::env;

#[tokio::test]
async fn the_relay_role_touches_no_order_writes_no_command_and_changes_no_schema() {
    let env = env().await;
    env.seed(1, 1).await;
    env.client
        .batch_execute(
            "INSERT INTO orders (id, payment_id) VALUES (1, 'pay_1');
             INSERT INTO processed_events (event_id, event_type, status, result, payload)
             VALUES ('evt_1', 'payment.succeeded', 'processed', '{}', '{}');",
        )
        .await
        .unwrap();
    let relay = TestDb::connect_url(&env.relay_url).await;
    for sql in [
        // Orders are the ingest's to change (and the shop's).
        "UPDATE orders SET status = 'paid'",
        "SELECT id FROM orders",
        "DELETE FROM orders",
        // Commands are the ingest's to write: none added, none rewritten.
        "INSERT INTO outbox (kind, payload, idempotency_key, event_id, order_id)
         VALUES ('ship_order', '{}', 'ship-2', 'evt_2', 2)",
        "UPDATE outbox SET payload = '{}'",
        "UPDATE outbox SET idempotency_key = 'x', kind = 'x'",
        // Events: counted and pruned, never read in full nor written.
        "SELECT payload FROM processed_events",
        "SELECT result FROM processed_events",
        "INSERT INTO processed_events (event_id, event_type, status, result)
         VALUES ('evt_2', 'x', 'x', '{}')",
        "UPDATE processed_events SET deliveries = 0",
        // No DDL, no bulk wipe.
        "TRUNCATE outbox",
        "DROP TABLE outbox",
        "ALTER TABLE outbox ADD COLUMN extra int",
        "DELETE FROM refinery_schema_history",
    ] {
        assert_refused(&relay, sql).await;
    }
}

#[tokio::test]
async fn every_grant_of_the_relay_role_is_used() {
    let env = env().await;
    let pool = pool(&env.relay_url);
    let grants = grants_of(&env.client, Role::Relay.group()).await;
    assert!(grants.len() >= 10, "{grants:?}");

    exercise_relay(&env.client, &pool, 0)
        .await
        .expect("the relay's statements work with the role's grants");
    for (n, grant) in grants.iter().enumerate() {
        env.client
            .batch_execute(&grant.revoke_sql(Role::Relay.group()))
            .await
            .unwrap();
        let result = exercise_relay(&env.client, &pool, n as i64 + 1).await;
        env.client
            .batch_execute(&grant.grant_sql(Role::Relay.group()))
            .await
            .unwrap();
        assert!(
            is_refused(&result),
            "outbox_relay holds {grant}, but the relay works without it: {result:?}"
        );
    }
}

#[tokio::test]
async fn the_monitor_role_counts_due_rows_and_nothing_else() {
    let env = env().await;
    env.seed(1, 3).await;
    let url = env.db.url_as(Role::Monitor);
    let monitor = TestDb::connect_url(&url).await;
    let due: i64 = monitor
        .query_one(storage::COUNT_DUE.text, &[])
        .await
        .expect("the KEDA query as the monitor role")
        .get("count");
    assert_eq!(due, 3);
    // Its login is read-only by default (a role setting, deploy/sql/roles.sql);
    // without that, the grants alone refuse all the same.
    let err = monitor.batch_execute("DELETE FROM outbox").await.unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::READ_ONLY_SQL_TRANSACTION), "{err:?}");
    monitor
        .batch_execute("SET default_transaction_read_only = off")
        .await
        .unwrap();
    for sql in [
        "SELECT payload FROM outbox",
        "SELECT * FROM outbox",
        "SELECT count(*) FROM processed_events",
        "SELECT count(*) FROM orders",
        "UPDATE outbox SET status = 'done'",
        "DELETE FROM outbox",
    ] {
        assert_refused(&monitor, sql).await;
    }

    let grants = grants_of(&env.client, Role::Monitor.group()).await;
    assert_eq!(grants.len(), 3, "{grants:?}");
    for grant in &grants {
        env.client
            .batch_execute(&grant.revoke_sql(Role::Monitor.group()))
            .await
            .unwrap();
        let result = monitor.query_one(storage::COUNT_DUE.text, &[]).await;
        env.client
            .batch_execute(&grant.grant_sql(Role::Monitor.group()))
            .await
            .unwrap();
        assert!(
            is_refused(&result),
            "outbox_monitor holds {grant}, but counts without it"
        );
    }
}

fn pool(url: &str) -> db::Pool {
    db::Database::parse(url).unwrap().pool(&db::ConnectOptions {
        application_name: "roles-test",
        statement_timeout: Some(Duration::from_secs(5)),
        lock_timeout: None,
        abort_when_client_leaves: false,
        asynchronous_commit: true,
        generic_plans: false,
        index_paths: false,
        pool_size: 1,
        pool_wait: Duration::from_secs(5),
    })
}

/// Every statement the relay and its operator commands run: claim, the
/// recheck of a claimed row, record verdicts, the gauges, `dead list`, `dead show`, `dead discard`,
/// `dead requeue`, `stats`, `prune`,
/// `audit`, the schema check behind `/readyz`.
async fn exercise_relay(
    admin: &tokio_postgres::Client,
    pool: &db::Pool,
    n: i64,
) -> Result<(), tokio_postgres::Error> {
    admin
        .execute(
            "INSERT INTO outbox (kind, payload, idempotency_key, event_id, order_id)
             VALUES ('ship_order', '{}', 'ship-' || $1::int8, 'evt_' || $1::int8, $1)",
            &[&n],
        )
        .await
        .unwrap();
    let client = pool.get().await.expect("a connection");
    let owner = format!("roles-test-{n}");
    let claimed = storage::claim_due_batch(&client, 10, &owner, Duration::from_secs(60), 25, None).await?;
    let first = claimed
        .first()
        .expect("nothing claimed: the recheck and completion statements would not run");
    storage::still_pending(&client, first, &owner).await?;
    let verdicts: Vec<_> = claimed
        .iter()
        .map(|row| RowVerdict {
            id: row.id,
            claim: row.claim,
            verdict: Verdict::Dead {
                error: "HTTP 400".into(),
            },
        })
        .collect();
    storage::record_verdicts(&client, &owner, &verdicts).await?;
    storage::backlog(&client).await?;
    storage::backlog_due(&client).await?;
    admin
        .execute(
            "INSERT INTO outbox (kind, payload, idempotency_key, event_id, order_id, status, last_error)
             VALUES ('send_confirmation', '{}', 'confirm-' || $1::int8, 'evt_' || $1::int8, $1, 'dead', 'HTTP 400')",
            &[&n],
        )
        .await
        .unwrap();
    let filter = storage::DeadFilter {
        kind: None,
        limit: 10,
        after: None,
    };
    let dead = storage::dead_rows(&client, &filter).await?.rows;
    let last = dead.last().expect("the dead rows just made");
    storage::outbox_row(&client, first.id).await?;
    let discarded = storage::discard_dead(&client, last.id, "roles test").await?;
    assert!(discarded.is_some(), "the discard ends the row");
    let dry = storage::RequeueFilter {
        dry_run: true,
        ..Default::default()
    };
    storage::requeue_dead(&client, &dry).await?;
    storage::requeue_dead(&client, &storage::RequeueFilter::default()).await?;
    storage::counts_by_status_and_kind(&client).await?;
    storage::prune(&client, 7).await?;
    storage::audit(&client, Duration::from_secs(3600)).await?;
    db::schema_status(&client).await?;
    Ok(())
}
