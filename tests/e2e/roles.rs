//! The operator's setup on a fresh cluster, as on a managed database where
//! the schema owner may not create roles: `migrate` as that owner says what
//! is missing and changes nothing it cannot finish; `deploy/sql/roles.sql`
//! (run with psql as an administrator) creates the groups and login users;
//! `migrate` then succeeds, and both services, logged in as `ingest_app` and
//! `relay_app`, deliver a webhook end to end.

use std::process::Command;
use std::time::Duration;

use harness::{Proc, SECRET, TempDir, event, post_signed, wait_ready};
use simulator::downstream::DownstreamConfig;
use testkit::PrivateCluster;

use crate::harness;

#[tokio::test]
async fn the_operators_roles_script_then_migrate_as_an_owner_without_createrole() {
    let cluster = PrivateCluster::start().expect("a private cluster");
    let port = cluster.port();
    let url = |user: &str, db: &str| format!("postgres://{user}:secret@127.0.0.1:{port}/{db}");
    let superuser = testkit::TestDb::connect_url(&cluster.url()).await;
    for sql in [
        "CREATE ROLE webhooks_owner LOGIN PASSWORD 'secret' NOCREATEROLE",
        "CREATE DATABASE webhooks OWNER webhooks_owner",
    ] {
        superuser.batch_execute(sql).await.unwrap();
    }
    let owner_url = url("webhooks_owner", "webhooks");

    // No groups yet, and the owner may not create them: a clear refusal.
    let (ok, err) = migrate(&owner_url);
    assert!(!ok, "migrate without the roles");
    assert!(err.contains("may not create them"), "{err}");
    assert!(err.contains("deploy/sql/roles.sql"), "the fix is named: {err}");

    // The operator's script, twice (it is idempotent).
    for _ in 0..2 {
        let out = Command::new("psql")
            .arg(cluster.url())
            .args([
                "-q",
                "-v",
                "owner_password=secret",
                "-v",
                "ingest_password=secret",
            ])
            .args(["-v", "relay_password=secret", "-v", "monitor_password=secret"])
            .arg("-f")
            .arg(testkit::workspace_root().join("deploy/sql/roles.sql"))
            .output()
            .expect("running psql (it comes with the PostgreSQL server)");
        assert!(
            out.status.success(),
            "deploy/sql/roles.sql: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (ok, err) = migrate(&owner_url);
    assert!(ok, "migrate once the roles exist: {err}");
    let (ok, err) = migrate(&owner_url);
    assert!(ok && err.contains("already current"), "{err}");

    let owner = testkit::TestDb::connect_url(&owner_url).await;
    owner
        .execute("INSERT INTO orders (id, payment_id) VALUES (1, 'pay_1')", &[])
        .await
        .unwrap();
    let downstream = simulator::downstream::spawn(DownstreamConfig::default())
        .await
        .unwrap();
    let dir = TempDir(std::env::temp_dir().join(format!("e2e-roles-{}", testkit::free_port())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let (ingest_port, ingest_admin, relay_admin) =
        (testkit::free_port(), testkit::free_port(), testkit::free_port());
    let mut ingest = Proc::spawn(
        "webhook-ingest",
        &[
            ("DATABASE_URL".into(), url("ingest_app", "webhooks")),
            ("WEBHOOK_SECRETS".into(), SECRET.into()),
            ("INGEST_LISTEN_ADDR".into(), format!("127.0.0.1:{ingest_port}")),
            ("ADMIN_LISTEN_ADDR".into(), format!("127.0.0.1:{ingest_admin}")),
        ],
        &dir.0,
    );
    let mut relay = Proc::spawn(
        "outbox-relay",
        &[
            ("DATABASE_URL".into(), url("relay_app", "webhooks")),
            ("FULFILMENT_URL".into(), downstream.url()),
            ("EMAIL_URL".into(), downstream.url()),
            ("ADMIN_LISTEN_ADDR".into(), format!("127.0.0.1:{relay_admin}")),
        ],
        &dir.0,
    );
    let http = testkit::http();
    wait_ready(&http, &format!("http://127.0.0.1:{ingest_admin}")).await;
    wait_ready(&http, &format!("http://127.0.0.1:{relay_admin}")).await;
    let body = event("evt_1", "payment.succeeded", "pay_1");
    let r = post_signed(
        &http,
        &format!("http://127.0.0.1:{ingest_port}"),
        &body,
        SECRET,
        &[],
    )
    .await;
    assert_eq!(r.status(), 200);
    let mut done = 0;
    for _ in 0..200 {
        done = owner
            .query_one("SELECT count(*) FROM outbox WHERE status = 'done'", &[])
            .await
            .unwrap()
            .get::<_, i64>(0);
        if done == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(done, 2, "shipment and confirmation delivered");
    assert_eq!(downstream.stats().effects, 2);
    ingest.stop(Duration::from_secs(10));
    relay.stop(Duration::from_secs(15));

    // The users own nothing, and the owner is the only one with DDL.
    let owned: i64 = owner
        .query_one(
            "SELECT count(*) FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner
              WHERE r.rolname IN ('ingest_app', 'relay_app', 'keda_app')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(owned, 0);
    let keda = testkit::TestDb::connect_url(&url("keda_app", "webhooks")).await;
    let due: i64 = keda
        .query_one(include_str!("../../crates/outbox-relay/sql/count_due.sql"), &[])
        .await
        .expect("the KEDA query as keda_app")
        .get(0);
    assert_eq!(due, 0);
    let ingest_client = testkit::TestDb::connect_url(&url("ingest_app", "webhooks")).await;
    testkit::assert_refused(&ingest_client, "DELETE FROM outbox").await;
    testkit::assert_refused(&ingest_client, "CREATE TABLE scratch (i int)").await;
}

/// `webhook-ingest migrate` against `url`: (success, stderr).
fn migrate(url: &str) -> (bool, String) {
    let out = Command::new(testkit::bin::path("webhook-ingest"))
        .arg("migrate")
        .env("DATABASE_URL", url)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
