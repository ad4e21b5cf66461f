//! The prune: what it deletes and keeps, how it reports, how it runs on
//! its own inside the relay, and what it costs the WAL.

use super::*;

/// Retention removes only what is old and finished; pending and dead rows,
/// recent history, and unmatched or discarded events of any age (money
/// received whose order did not exist yet: the only copy) stay.
#[tokio::test]
async fn prune_deletes_old_finished_rows_and_events_only() {
    let env = env().await;
    env.seed(1, 2500).await;
    env.client
        .batch_execute(
            "UPDATE outbox SET status = 'done', finished_at = now() - interval '8 days' WHERE order_id <= 2200;
             UPDATE outbox SET status = 'cancelled', finished_at = now() - interval '9 days' WHERE order_id BETWEEN 2201 AND 2210;
             UPDATE outbox SET status = 'done', finished_at = now() - interval '1 day' WHERE order_id BETWEEN 2211 AND 2300;
             UPDATE outbox SET status = 'dead', finished_at = now() - interval '30 days' WHERE order_id BETWEEN 2301 AND 2310;
             INSERT INTO processed_events (event_id, event_type, status, result, processed_at)
             SELECT 'evt_old_' || n, 'payment.succeeded', 'processed', '{}', now() - interval '8 days'
               FROM generate_series(1, 1500) n;
             INSERT INTO processed_events (event_id, event_type, status, result)
             SELECT 'evt_new_' || n, 'payment.succeeded', 'processed', '{}' FROM generate_series(1, 10) n;
             INSERT INTO processed_events (event_id, event_type, status, result, processed_at)
             SELECT 'evt_early_' || n, 'payment.succeeded', 'unmatched', '{}', now() - n * interval '10 days'
               FROM generate_series(1, 5) n;
             INSERT INTO processed_events (event_id, event_type, status, result, processed_at, discarded_reason, discarded_at)
             VALUES ('evt_discarded', 'payment.succeeded', 'discarded', '{}', now() - interval '60 days', 'a test payment', now() - interval '50 days');",
        )
        .await
        .unwrap();
    let (ok, out, err) = relay_cli(&env.relay_url, &["prune"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("pruned 2210 outbox row(s) and 1500 processed event(s)"),
        "{out}"
    );
    assert_eq!(env.count("SELECT count(*) FROM outbox").await, 2500 - 2210);
    assert_eq!(
        env.count("SELECT count(*) FROM outbox WHERE status = 'dead'")
            .await,
        10
    );
    assert_eq!(
        env.count("SELECT count(*) FROM outbox WHERE status = 'pending'")
            .await,
        190
    );
    assert_eq!(env.count("SELECT count(*) FROM processed_events").await, 16);
    assert_eq!(
        env.count("SELECT count(*) FROM processed_events WHERE status IN ('unmatched', 'discarded')")
            .await,
        6,
        "no unmatched or discarded event is pruned, whatever its age"
    );

    // One replica at a time: while another session holds the lock, nothing runs.
    env.client
        .execute("SELECT pg_advisory_lock($1)", &[&0x5052_554e_4552_0001_i64])
        .await
        .unwrap();
    let (ok, out, _) = relay_cli(&env.relay_url, &["prune"]);
    assert!(ok && out.contains("another replica"), "{out}");
}

/// A long prune says where it is: a line on stderr per progress interval
/// (here every batch, so the test counts them, not seconds), the rows per
/// table growing batch by batch, then one summary; `--json` makes the
/// summary one object on stdout.
#[tokio::test]
async fn a_long_prune_prints_its_progress_then_its_summary() {
    let env = env().await;
    let batch = outbox_relay::storage::PRUNE_BATCH;
    // Outbox rows for three batches (the last one short), events for two.
    let (rows, events) = (2 * batch + 100, batch + 50);
    env.seed(1, rows).await;
    env.client
        .batch_execute(&format!(
            "UPDATE outbox SET status = 'done', finished_at = now() - interval '8 days';
             INSERT INTO processed_events (event_id, event_type, status, result, processed_at)
             SELECT 'evt_old_' || n, 'payment.succeeded', 'processed', '{{}}', now() - interval '8 days'
               FROM generate_series(1, {events}) n;"
        ))
        .await
        .unwrap();
    let (ok, out, err) = relay_cli(&env.relay_url, &["prune", "--json", "--progress-every", "0"]);
    assert!(ok, "{err}");

    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 5, "one line per batch: {err}");
    let expected = [
        (batch, 0, "outbox"),
        (2 * batch, 0, "outbox"),
        (rows, 0, "outbox"),
        (rows, batch, "processed_events"),
        (rows, events, "processed_events"),
    ];
    for (i, (line, (outbox, processed, table))) in lines.iter().zip(expected).enumerate() {
        assert!(line.starts_with("prune "), "{line}");
        for part in [
            format!("outbox {outbox} row(s)"),
            format!("processed_events {processed},"),
            format!("{} batch(es)", i + 1),
            format!("deleting from {table}"),
        ] {
            assert!(line.contains(&part), "line {i}: {part:?} not in {line:?}");
        }
    }

    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary["ran"], true, "{summary}");
    assert_eq!(summary["outbox_rows"], rows, "{summary}");
    assert_eq!(summary["processed_events"], events, "{summary}");
    assert_eq!(summary["batches"], 5, "{summary}");
    assert_eq!(summary["retention_days"], 7, "{summary}");
    assert!(summary["elapsed_secs"].as_f64().unwrap() > 0.0, "{summary}");

    // Nothing left: one batch per table, and the line for people.
    let (ok, out, err) = relay_cli(&env.relay_url, &["prune", "--progress-every", "0"]);
    assert!(ok, "{err}");
    assert_eq!(err.lines().count(), 2, "{err}");
    assert!(
        out.starts_with("pruned 0 outbox row(s) and 0 processed event(s) older than 7 day(s) in "),
        "{out}"
    );
    assert!(out.contains("(2 batch(es))"), "{out}");
}

/// The relay's `/metrics` at `admin`; `None` until it answers.
async fn metrics(env: &crate::helpers::Env, admin: &str) -> Option<Metrics> {
    Metrics::fetch(&env.http, &format!("http://{admin}")).await.ok()
}

/// The sample of `name{label=value}`, once it exists and reads at least `at_least`.
async fn wait_for_metric(
    env: &crate::helpers::Env,
    admin: &str,
    name: &str,
    label: (&str, &str),
    at_least: f64,
) -> f64 {
    let started = std::time::Instant::now();
    loop {
        let value = metrics(env, admin).await.and_then(|m| m.find(name, &[label]));
        if let Some(v) = value
            && v >= at_least
        {
            return v;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{name}{label:?}: {value:?}, expected at least {at_least}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_relay_prunes_on_its_own_and_counts_runs_rows_and_failures() {
    let env = env().await;
    env.seed(1, 300).await;
    env.client
        .batch_execute(
            "UPDATE outbox SET status = 'done', finished_at = now() - interval '8 days' WHERE order_id <= 250;
             INSERT INTO processed_events (event_id, event_type, status, result, processed_at)
             SELECT 'evt_old_' || n, 'payment.succeeded', 'processed', '{}', now() - interval '8 days'
               FROM generate_series(1, 120) n;",
        )
        .await
        .unwrap();
    let admin = format!("127.0.0.1:{}", testkit::free_port());
    let relay = env.spawn_relay(&[("RELAY_PRUNE_INTERVAL_SECS", "1"), ("ADMIN_LISTEN_ADDR", &admin)]);

    // Before the first run every series reads 0, failures included.
    let (runs, failed) = ("outbox_prune_runs_total", ("result", "failed"));
    assert_eq!(wait_for_metric(&env, &admin, runs, failed, 0.0).await, 0.0);

    wait_for_metric(&env, &admin, runs, ("result", "pruned"), 1.0).await;
    let after_first = metrics(&env, &admin).await.unwrap();
    assert_eq!(
        after_first.find("outbox_pruned_rows_total", &[("table", "outbox")]),
        Some(250.0)
    );
    assert_eq!(
        after_first.find("outbox_pruned_rows_total", &[("table", "processed_events")]),
        Some(120.0)
    );
    assert_eq!(
        env.count("SELECT count(*) FROM outbox WHERE order_id <= 250")
            .await,
        0
    );
    assert_eq!(env.count("SELECT count(*) FROM processed_events").await, 0);
    assert_eq!(
        metrics(&env, &admin).await.unwrap().find(runs, &[failed]),
        Some(0.0)
    );

    // Retention that cannot run is counted, and the relay carries on.
    env.client
        .batch_execute(
            "REVOKE DELETE ON processed_events FROM outbox_relay;
             INSERT INTO processed_events (event_id, event_type, status, result, processed_at)
             VALUES ('evt_stuck', 'payment.succeeded', 'processed', '{}', now() - interval '8 days');",
        )
        .await
        .unwrap();
    wait_for_metric(&env, &admin, runs, failed, 2.0).await;
    assert_eq!(
        env.count("SELECT count(*) FROM processed_events WHERE event_id = 'evt_stuck'")
            .await,
        1
    );
    // Still delivering: the 50 pending rows of the seed are done.
    env.wait_for(
        "SELECT count(*) FROM outbox WHERE status = 'done' AND order_id > 250",
        50,
        std::time::Duration::from_secs(20),
    )
    .await;
    relay.signal("TERM");
    let (code, _) = relay.wait(std::time::Duration::from_secs(20));
    assert_eq!(code, Some(0));
}

/// The prune compresses the full-page images of its WAL when the relay's
/// role may set `wal_compression`, and runs as before when it may not. On a
/// cluster of its own: the grant is cluster-wide.
#[tokio::test]
async fn the_prune_compresses_its_wal_when_its_role_may_and_says_which_it_did() {
    let cluster = testkit::PrivateCluster::start().expect("a private cluster");
    let admin_url = cluster.migrated_database("prune_wal").await.unwrap();
    let relay_url = testkit::login_url(&admin_url, testkit::Role::Relay).await;
    let admin = testkit::TestDb::connect_url(&admin_url).await;
    // 300 events past the retention, then the prune's line.
    let prune_old_events = |n: i32| {
        let (admin, relay_url) = (&admin, &relay_url);
        async move {
            admin
                .batch_execute(&format!(
                    "INSERT INTO processed_events (event_id, event_type, status, result, processed_at)
                     SELECT 'evt_{n}_' || i, 'payment.succeeded', 'processed', '{{}}', now() - interval '8 days'
                       FROM generate_series(1, 300) i"
                ))
                .await
                .unwrap();
            let (ok, out, err) = relay_cli(relay_url, &["prune"]);
            assert!(ok, "{err}");
            assert!(
                out.contains("pruned 0 outbox row(s) and 300 processed event(s)"),
                "{out}"
            );
            out
        }
    };

    let out = prune_old_events(1).await;
    assert!(
        out.contains("the server's wal_compression setting applied"),
        "{out}"
    );

    admin
        .batch_execute("GRANT SET ON PARAMETER wal_compression TO outbox_relay")
        .await
        .unwrap();
    let out = prune_old_events(2).await;
    assert!(
        out.contains("full-page images compressed with lz4") || out.contains("compressed with pglz"),
        "{out}"
    );
}

/// The prune's session commits without waiting for the WAL flush (its
/// deletes are redone by the next prune if a crash loses them) and bounds its
/// statements, whatever its login role sets: here a role that sets neither
/// (the relay's own role in the tests, as deploy/sql/roles.sql's `relay_app`,
/// commits asynchronously already).
#[tokio::test]
async fn the_prune_commits_asynchronously_and_bounds_its_statements() {
    let env = env().await;
    let client = db::Database::parse(&env.db.url)
        .unwrap()
        .connect_with(&outbox_relay::storage::prune_connect_options())
        .await
        .unwrap();
    let show = |name: &'static str| {
        let client = &client;
        async move {
            let row = client.query_one(&format!("SHOW {name}"), &[]).await.unwrap();
            row.get::<_, String>(0)
        }
    };
    assert_eq!(show("synchronous_commit").await, "off");
    assert_eq!(show("statement_timeout").await, "1min");
    assert_eq!(show("application_name").await, "outbox-relay-prune");
}
