//! A search_path hijack (CVE-2018-1058), tried for real. PostgreSQL resolves
//! a function or operator across the whole `search_path` by best match of
//! the argument types, `pg_catalog` first only to break ties, so where a role
//! may create objects in `public` (every role, before PostgreSQL 15) a
//! `public.jsonb_build_object(text, text, text, text, text, bigint)` beats
//! the catalog's `VARIADIC "any"` one and runs inside whoever calls it.
//!
//! - The services' sessions resolve names in `pg_catalog` alone (startup
//!   options, or the login role's setting), and their statements name their
//!   tables: the shadows a role planted are never called.
//! - `webhook-ingest migrate`, whose migrations name nothing and so run with
//!   `public` on the path, refuses a schema `public` in which others may
//!   create, saying what to revoke, and migrates nothing.
//! - Behind a transaction-mode pooler only the role's setting can pin the
//!   path: a role without it leaves the service unready.

use std::process::Command;
use std::time::Duration;

use harness::{Proc, SECRET, TempDir, event, post_signed, wait_ready};
use simulator::downstream::DownstreamConfig;
use testkit::{Role, TestDb};

use crate::harness;

/// What the monitor (KEDA) role plants in `public` once it may create there:
/// a table every role may write to, and shadows with the exact argument
/// types of calls the services' statements make. Each records who called it
/// and what, then does what the real one does, so the services work on.
const SHADOWS: &str = r"
CREATE TABLE public.hijacked (who text, what text);
GRANT INSERT ON public.hijacked TO PUBLIC;

-- The ingest's stored response (record_event.sql, for payments and refunds):
-- jsonb_build_object('event_id', <text>, 'status', <text>, 'order_id', <bigint>).
CREATE FUNCTION public.jsonb_build_object(text, text, text, text, text, bigint) RETURNS jsonb
LANGUAGE sql AS $$
    INSERT INTO public.hijacked VALUES (current_user, 'jsonb_build_object(text, text, text, text, text, bigint)');
    SELECT pg_catalog.jsonb_build_object($1, $2, $3, $4, $5, $6)
$$;
-- The outbox payload: jsonb_build_object('v', <int4>, 'order_id', <bigint>, 'event_id', <text>).
CREATE FUNCTION public.jsonb_build_object(text, integer, text, bigint, text, text) RETURNS jsonb
LANGUAGE sql AS $$
    INSERT INTO public.hijacked VALUES (current_user, 'jsonb_build_object(text, integer, text, bigint, text, text)');
    SELECT pg_catalog.jsonb_build_object($1, $2, $3, $4, $5, $6)
$$;
-- A type the ingest ignores (record_claim_only.sql):
-- jsonb_build_object('event_id', $1::text, 'status', $3::text).
CREATE FUNCTION public.jsonb_build_object(text, text, text, text) RETURNS jsonb
LANGUAGE sql AS $$
    INSERT INTO public.hijacked VALUES (current_user, 'jsonb_build_object(text, text, text, text)');
    SELECT pg_catalog.jsonb_build_object($1, $2, $3, $4)
$$;
-- The idempotency key: <text> || <bigint> (the catalog has only text || anynonarray).
CREATE FUNCTION public.shadow_concat(text, bigint) RETURNS text
LANGUAGE sql AS $$
    INSERT INTO public.hijacked VALUES (current_user, 'text || bigint');
    SELECT $1 OPERATOR(pg_catalog.||) $2::pg_catalog.text
$$;
CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = bigint, FUNCTION = public.shadow_concat);
-- The relay's lease and backoff (claim.sql, complete.sql): <int8> * interval
-- (the catalog has only float8 * interval).
CREATE FUNCTION public.shadow_times(bigint, interval) RETURNS interval
LANGUAGE sql AS $$
    INSERT INTO public.hijacked VALUES (current_user, 'bigint * interval');
    SELECT $1::pg_catalog.float8 OPERATOR(pg_catalog.*) $2
$$;
CREATE OPERATOR public.* (LEFTARG = bigint, RIGHTARG = interval, FUNCTION = public.shadow_times);
";

/// Each shadowed call once, typed as the statements type it.
const SHADOWED_CALLS: &str =
    "SELECT jsonb_build_object('event_id', 'e'::text, 'status', 's'::text, 'order_id', 1::bigint),
        jsonb_build_object('v', 1::int4, 'order_id', 1::bigint, 'event_id', 'e'::text),
        jsonb_build_object('event_id', 'e'::text, 'status', 's'::text),
        'ship' || '-' || 1::bigint,
        now() + 5::int8 * interval '1 millisecond'";

#[tokio::test]
async fn a_role_that_may_create_in_public_cannot_make_the_services_run_its_functions() {
    let (db, admin) = a_database_where_the_monitor_role_planted_shadows().await;
    let mut services = start_services(&db).await;
    let http = testkit::http();

    // A payment (record_event.sql), its shipment and confirmation sent; then
    // a refund (record_event.sql with its shipment's step) and its notice; and a type
    // the ingest ignores (record_claim_only.sql).
    let paid = post_signed(
        &http,
        &services.ingest_url,
        &event("evt_1", "payment.succeeded", "pay_1"),
        SECRET,
        &[],
    )
    .await;
    assert_eq!(paid.status(), 200);
    let body: serde_json::Value = paid.json().await.unwrap();
    assert_eq!(
        body,
        serde_json::json!({"event_id": "evt_1", "status": "processed", "order_id": 1})
    );
    let done = "SELECT count(*) FROM outbox WHERE status = 'done'";
    testkit::wait_for_count(&admin, done, 2, Duration::from_secs(20)).await;
    let refunded = post_signed(
        &http,
        &services.ingest_url,
        &event("evt_2", "payment.refunded", "pay_1"),
        SECRET,
        &[],
    )
    .await;
    assert_eq!(refunded.status(), 200);
    let ignored = post_signed(
        &http,
        &services.ingest_url,
        &event("evt_3", "customer.created", "pay_1"),
        SECRET,
        &[],
    )
    .await;
    assert_eq!(ignored.status(), 200);
    let body: serde_json::Value = ignored.json().await.unwrap();
    assert_eq!(
        body,
        serde_json::json!({"event_id": "evt_3", "status": "ignored"})
    );
    testkit::wait_for_count(&admin, done, 3, Duration::from_secs(20)).await;
    services.ingest.stop(Duration::from_secs(10));
    services.relay.stop(Duration::from_secs(15));

    let calls: Vec<String> = admin
        .query("SELECT who || ' called ' || what FROM public.hijacked", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        calls.is_empty(),
        "the services ran the monitor role's functions: {calls:?}"
    );
    // And the effects are the real functions' and operators'.
    let order: String = admin
        .query_one("SELECT status FROM orders WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(order, "refunded");
    let keys: Vec<String> = admin
        .query(
            "SELECT idempotency_key || ' ' || payload::text FROM outbox ORDER BY idempotency_key",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        keys,
        [
            r#"conf-1 {"v": 1, "event_id": "evt_1", "order_id": 1}"#,
            r#"refund-1 {"v": 1, "event_id": "evt_2", "order_id": 1}"#,
            r#"ship-1 {"v": 1, "event_id": "evt_1", "order_id": 1}"#,
        ]
    );
    let stats = services.downstream.stats();
    assert_eq!((stats.effects, stats.double_effects), (3, 0), "{stats:?}");
}

/// A database where `public` is open to every role, and the monitor role has
/// planted functions and operators that shadow the catalog's (proven to win
/// on the default search_path); the services' roles start their sessions on
/// that default path here, so only their own pinning protects them.
async fn a_database_where_the_monitor_role_planted_shadows() -> (TestDb, tokio_postgres::Client) {
    let db = TestDb::new().await;
    let admin = db.client().await;
    admin
        .batch_execute(
            "GRANT CREATE ON SCHEMA public TO PUBLIC;
             INSERT INTO orders (id, payment_id) VALUES (1, 'pay_1');",
        )
        .await
        .unwrap();
    let monitor = TestDb::connect_url(&db.url_as(Role::Monitor)).await;
    // Its role's sessions default to read-only, which stops nobody.
    monitor
        .batch_execute("SET default_transaction_read_only = off")
        .await
        .unwrap();
    monitor
        .batch_execute(SHADOWS)
        .await
        .expect("planting the shadows");

    // The shadows are real: on the default search_path each one wins over
    // the catalog's function or operator; on pg_catalog alone none does.
    admin.batch_execute(SHADOWED_CALLS).await.unwrap();
    assert_eq!(
        testkit::count(&admin, "SELECT count(*) FROM public.hijacked").await,
        5,
        "every shadow is picked on the default search_path"
    );
    admin
        .batch_execute(&format!(
            "DELETE FROM public.hijacked; SET search_path = pg_catalog; {SHADOWED_CALLS}; RESET search_path"
        ))
        .await
        .unwrap();
    assert_eq!(
        testkit::count(&admin, "SELECT count(*) FROM public.hijacked").await,
        0
    );

    // The test roles pin search_path on the role too (as deploy/sql/roles.sql
    // recommends for poolers); here, in this database only, their sessions
    // start on the default path instead, so that what protects them is the
    // services' own `-c search_path=pg_catalog` alone.
    for role in [Role::Ingest, Role::Relay] {
        admin
            .batch_execute(&format!(
                "ALTER ROLE {} IN DATABASE \"{}\" SET search_path = \"$user\", public",
                role.login(),
                db.name
            ))
            .await
            .unwrap();
    }

    (db, admin)
}

struct Services {
    ingest: Proc,
    relay: Proc,
    ingest_url: String,
    downstream: simulator::downstream::RunningDownstream,
    _dir: TempDir,
}

/// Both services, as their roles, sessions as they open them.
async fn start_services(db: &TestDb) -> Services {
    let downstream = simulator::downstream::spawn(DownstreamConfig::default())
        .await
        .unwrap();
    let dir = TempDir(std::env::temp_dir().join(format!("e2e-search-path-{}", testkit::free_port())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let (ingest_port, ingest_admin, relay_admin) =
        (testkit::free_port(), testkit::free_port(), testkit::free_port());
    let ingest = Proc::spawn(
        "webhook-ingest",
        &[
            ("DATABASE_URL".into(), db.url_as(Role::Ingest)),
            ("WEBHOOK_SECRETS".into(), SECRET.into()),
            ("INGEST_LISTEN_ADDR".into(), format!("127.0.0.1:{ingest_port}")),
            ("ADMIN_LISTEN_ADDR".into(), format!("127.0.0.1:{ingest_admin}")),
        ],
        &dir.0,
    );
    let relay = Proc::spawn(
        "outbox-relay",
        &[
            ("DATABASE_URL".into(), db.url_as(Role::Relay)),
            ("FULFILMENT_URL".into(), downstream.url()),
            ("EMAIL_URL".into(), downstream.url()),
            ("ADMIN_LISTEN_ADDR".into(), format!("127.0.0.1:{relay_admin}")),
            ("RELAY_POLL_INTERVAL_MS".into(), "200".into()),
        ],
        &dir.0,
    );
    let http = testkit::http();
    wait_ready(&http, &format!("http://127.0.0.1:{ingest_admin}")).await;
    wait_ready(&http, &format!("http://127.0.0.1:{relay_admin}")).await;
    Services {
        ingest,
        relay,
        ingest_url: format!("http://127.0.0.1:{ingest_port}"),
        downstream,
        _dir: dir,
    }
}

#[tokio::test]
async fn migrate_refuses_a_schema_public_where_others_may_create_and_says_what_to_revoke() {
    let db = TestDb::empty().await;
    let admin = db.client().await;
    let tables = "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'";

    admin
        .batch_execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        .await
        .unwrap();
    let (code, err) = migrate(&db.url);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("REVOKE CREATE ON SCHEMA public FROM PUBLIC;"),
        "{err}"
    );
    assert_eq!(testkit::count(&admin, tables).await, 0, "migrated nothing");

    // A role granted CREATE by name is refused the same way, and named.
    admin
        .batch_execute(&format!(
            "REVOKE CREATE ON SCHEMA public FROM PUBLIC; GRANT CREATE ON SCHEMA public TO {}",
            Role::Monitor.login()
        ))
        .await
        .unwrap();
    let (code, err) = migrate(&db.url);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "REVOKE CREATE ON SCHEMA public FROM {};",
            Role::Monitor.login()
        )),
        "{err}"
    );
    assert_eq!(testkit::count(&admin, tables).await, 0, "migrated nothing");

    admin
        .batch_execute(&format!(
            "REVOKE CREATE ON SCHEMA public FROM {}",
            Role::Monitor.login()
        ))
        .await
        .unwrap();
    let (code, err) = migrate(&db.url);
    assert_eq!(code, Some(0), "migrate once only the owner may create: {err}");
    assert!(err.contains("applied migrations"), "{err}");
    assert!(testkit::count(&admin, tables).await >= 4);
}

/// `webhook-ingest migrate` against `url`: (exit code, stderr).
fn migrate(url: &str) -> (Option<i32>, String) {
    let out = Command::new(testkit::bin::path("webhook-ingest"))
        .arg("migrate")
        .env("DATABASE_URL", url)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A login role in the ingest's group that sets no `search_path`, as an
/// operator who skipped deploy/sql/roles.sql's settings would have.
const UNPINNED: &str = "webhook_test_unpinned";

#[tokio::test]
async fn behind_a_transaction_pooler_a_role_without_its_search_path_leaves_the_service_unready() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    admin
        .batch_execute(&format!(
            "DO $$
             BEGIN
                 CREATE ROLE {UNPINNED} LOGIN PASSWORD '{}' IN ROLE {};
             EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
             END
             $$;
             ALTER ROLE {UNPINNED} RESET search_path;",
            testkit::ROLE_PASSWORD,
            Role::Ingest.group()
        ))
        .await
        .unwrap();
    let url = testkit::url_with_user(&db.url, UNPINNED, testkit::ROLE_PASSWORD);
    let dir = TempDir(std::env::temp_dir().join(format!("e2e-unpinned-{}", testkit::free_port())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let http = testkit::http();
    let ingest = |pool_mode: &str| {
        let admin_port = testkit::free_port();
        let proc = Proc::spawn(
            "webhook-ingest",
            &[
                ("DATABASE_URL".into(), url.clone()),
                ("DATABASE_POOL_MODE".into(), pool_mode.into()),
                ("WEBHOOK_SECRETS".into(), SECRET.into()),
                (
                    "INGEST_LISTEN_ADDR".into(),
                    format!("127.0.0.1:{}", testkit::free_port()),
                ),
                ("ADMIN_LISTEN_ADDR".into(), format!("127.0.0.1:{admin_port}")),
            ],
            &dir.0,
        );
        (proc, format!("http://127.0.0.1:{admin_port}"))
    };

    // Directly (session mode) the startup options pin it: ready.
    let (mut direct, direct_admin) = ingest("session");
    wait_ready(&http, &direct_admin).await;
    direct.stop(Duration::from_secs(10));

    // In transaction mode nothing but the role could: not ready, saying so,
    // and the log names the fix.
    let (mut pooled, pooled_admin) = ingest("transaction");
    let started = std::time::Instant::now();
    let answer = loop {
        if let Ok(r) = http.get(format!("{pooled_admin}/readyz")).send().await {
            let status = r.status();
            let body = r.text().await.unwrap();
            if status == 503 && body.contains("search_path") {
                break body;
            }
            assert_ne!(status, 200, "ready with an unpinned search_path");
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never said why it is not ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        answer,
        "not ready: database search_path not pinned to pg_catalog\n"
    );
    pooled.stop(Duration::from_secs(10));
    let log = pooled.log();
    assert!(
        log.contains(&format!("ALTER ROLE {UNPINNED} SET search_path = pg_catalog")),
        "{log}"
    );
}
