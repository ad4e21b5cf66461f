//! Least privilege: the `webhook_ingest` role (migrations/V2__roles.sql)
//! holds what the ingest uses and nothing else. Everything else is refused,
//! and every grant it holds is needed: revoke any one and the ingest's
//! statements fail. (Every other test of this crate runs the ingest as a
//! member of the role, which shows the grants suffice.)

use std::time::Duration;

use testkit::{Role, TestDb, assert_refused, grants_of, is_refused};
use webhook_ingest::storage;

use crate::helpers::event;

#[tokio::test]
async fn the_ingest_role_can_neither_delete_nor_read_what_it_does_not_use_nor_change_the_schema() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    admin
        .batch_execute(
            "INSERT INTO orders (id, payment_id) VALUES (1, 'pay_1');
             INSERT INTO outbox (kind, payload, idempotency_key, event_id, order_id)
             VALUES ('ship_order', '{}', 'ship-1', 'evt_1', 1);",
        )
        .await
        .unwrap();
    let ingest = TestDb::connect_url(&db.url_as(Role::Ingest)).await;
    for sql in [
        // No deletes anywhere: retention is the relay's, orders the shop's.
        "DELETE FROM outbox",
        "DELETE FROM processed_events",
        "DELETE FROM orders",
        "TRUNCATE outbox",
        // Orders are changed, never created.
        "INSERT INTO orders (id, payment_id) VALUES (2, 'pay_2')",
        // Commands are written once: not rewritten, and the relay's columns
        // are the relay's.
        "UPDATE outbox SET payload = '{}'",
        "UPDATE outbox SET idempotency_key = 'x'",
        "UPDATE outbox SET attempts = 0, available_at = now()",
        // It reads what a shipment is matched on and what `events show`
        // tells of a command, never what is sent.
        "SELECT payload FROM outbox",
        "SELECT trace_context FROM outbox",
        "SELECT claims FROM outbox",
        "SELECT * FROM outbox",
        "SELECT created_at FROM orders",
        // No DDL: it owns nothing.
        "DROP TABLE outbox",
        "ALTER TABLE outbox ADD COLUMN extra int",
        "CREATE INDEX ON outbox (kind)",
        "DELETE FROM refinery_schema_history",
        // The identity column draws ids without a grant on its sequence.
        "SELECT nextval('outbox_id_seq')",
    ] {
        assert_refused(&ingest, sql).await;
    }
    let version: i32 = admin
        .query_one("SELECT current_setting('server_version_num')::int4", &[])
        .await
        .unwrap()
        .get(0);
    // Since PostgreSQL 15, nobody but the database owner creates in `public`
    // (before, deploy/sql/roles.sql revokes it).
    if version >= 150_000 {
        assert_refused(&ingest, "CREATE TABLE scratch (i int)").await;
    }
}

#[tokio::test]
async fn every_grant_of_the_ingest_role_is_used() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    let pool = ingest_pool(&db);
    let grants = grants_of(&admin, Role::Ingest.group()).await;
    assert!(grants.len() >= 15, "{grants:?}");

    exercise(&admin, &pool, 0)
        .await
        .expect("the ingest's statements work with the role's grants");
    for (n, grant) in grants.iter().enumerate() {
        admin
            .batch_execute(&grant.revoke_sql(Role::Ingest.group()))
            .await
            .unwrap();
        let result = exercise(&admin, &pool, n as i64 + 1).await;
        admin
            .batch_execute(&grant.grant_sql(Role::Ingest.group()))
            .await
            .unwrap();
        assert!(
            is_refused(&result),
            "webhook_ingest holds {grant}, but the ingest works without it: {result:?}"
        );
    }
}

fn ingest_pool(db: &TestDb) -> db::Pool {
    db::Database::parse(&db.url_as(Role::Ingest))
        .unwrap()
        .pool(&db::ConnectOptions {
            application_name: "roles-test",
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

/// Every statement the ingest runs: a payment and a refund for a fresh order
/// (claim, order change, enqueue, cancellation), a duplicate, `events list`,
/// `events show`, `events replay`, the schema check behind `/readyz`.
async fn exercise(
    admin: &tokio_postgres::Client,
    pool: &db::Pool,
    n: i64,
) -> Result<(), tokio_postgres::Error> {
    let payment = format!("pay_{n}");
    admin
        .execute(
            "INSERT INTO orders (id, payment_id) VALUES ($1, $2)",
            &[&(n + 100), &payment],
        )
        .await
        .unwrap();
    let client = pool.get().await.expect("a connection");
    for (id, kind) in [
        (format!("evt_paid_{n}"), "payment.succeeded"),
        (format!("evt_paid_{n}"), "payment.succeeded"),
        (format!("evt_refund_{n}"), "payment.refunded"),
    ] {
        let body = event(&id, kind, &payment);
        let parsed = domain::ProviderEvent::parse(body.as_bytes()).unwrap();
        storage::record_event(&client, &parsed, &body, None).await?;
    }
    let filter = storage::EventFilter {
        status: Some(domain::EventOutcome::Refunded),
        limit: 10,
        ..Default::default()
    };
    storage::list_events(&client, &filter).await?;
    // `events show`: the event, and its order's commands.
    storage::show_event(&client, &format!("evt_paid_{n}")).await?;
    storage::order_commands(&client, n + 100).await?;
    // `events replay`: a payment recorded unmatched, applied once its order
    // exists.
    let late = format!("pay_late_{n}");
    let body = event(&format!("evt_late_{n}"), "payment.succeeded", &late);
    let parsed = domain::ProviderEvent::parse(body.as_bytes()).unwrap();
    storage::record_event(&client, &parsed, &body, None).await?;
    admin
        .execute(
            "INSERT INTO orders (id, payment_id) VALUES ($1, $2)",
            &[&(n + 100_000), &late],
        )
        .await
        .unwrap();
    let replayed = storage::replay_event(&client, &parsed).await?;
    assert!(replayed.is_some(), "the replay applies the event");
    // The reconciler's look-up and gauges, and `events discard`.
    let now = time::OffsetDateTime::now_utc();
    storage::matchable_events(&client, now - Duration::from_secs(3600), 10).await?;
    storage::unmatched_backlog(&client, now - Duration::from_secs(3600), 10).await?;
    let stray = format!("evt_stray_{n}");
    let body = event(&stray, "payment.succeeded", &format!("pay_stray_{n}"));
    let parsed = domain::ProviderEvent::parse(body.as_bytes()).unwrap();
    storage::record_event(&client, &parsed, &body, None).await?;
    let discarded = storage::discard_event(&client, &stray, "never matches").await?;
    assert!(discarded.is_some(), "the discard marks the event");
    db::schema_status(&client).await?;
    Ok(())
}
