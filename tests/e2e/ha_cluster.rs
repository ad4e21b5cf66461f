//! `scripts/ha-cluster.sh` itself (through `testkit::HaCluster`): a real
//! failover under writes. A few tasks insert rows over the multi-host URL
//! (`target_session_attrs=read-write`), each remembering the ids whose
//! commit was acknowledged; the primary's postmaster gets SIGKILL; Patroni
//! promotes the synchronous standby; the writers, on fresh connections after
//! an error, reach it by themselves. Every acknowledged id must be on the new
//! primary. Prints the window without a successful write and the time to the
//! new primary.
//!
//! Ignored in `make test` (it needs Patroni and etcd): `make failover`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testkit::{HaCluster, Replication, Role};

const WRITERS: i64 = 4;

/// Inserts rows until `stop`, each id once whatever became of it; records
/// the ids whose commit was acknowledged, and when.
async fn write(url: String, writer: i64, stop: Arc<AtomicBool>, acked: Arc<Mutex<Vec<(i64, Instant)>>>) {
    let database = db::Database::parse(&url).unwrap();
    let mut client = None;
    let mut id = writer * 1_000_000_000;
    while !stop.load(Ordering::Acquire) {
        let Some(c) = &client else {
            match database.connect("ha-writer").await {
                Ok(c) => client = Some(c),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
            continue;
        };
        id += 1;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&id, &writer];
        let insert = c.execute(
            "INSERT INTO public.ha_probe (id, writer) VALUES ($1, $2)",
            &params,
        );
        match tokio::time::timeout(Duration::from_secs(5), insert).await {
            Ok(Ok(1)) => acked.lock().unwrap().push((id, Instant::now())),
            // Not acknowledged (it may or may not have committed): a fresh
            // connection, which finds the primary, whichever it is now.
            _ => {
                client = None;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Patroni and etcd: make failover"]
async fn ha_cluster_fails_over_without_losing_an_acknowledged_write() {
    let started = Instant::now();
    let cluster =
        tokio::task::block_in_place(|| HaCluster::start(Replication::Sync)).expect("a Patroni cluster");
    eprintln!(
        "ha_cluster: started in {:.1} s\n{}",
        started.elapsed().as_secs_f64(),
        cluster.status()
    );
    let url = cluster.migrated_database("ha_probe").await.unwrap();
    assert!(
        url.contains(",127.0.0.1:") && url.ends_with("/ha_probe?target_session_attrs=read-write"),
        "the database's URL names both nodes and asks for the primary"
    );
    let admin = testkit::TestDb::connect_url(&url).await;
    admin
        .batch_execute("CREATE TABLE public.ha_probe (id bigint PRIMARY KEY, writer bigint NOT NULL)")
        .await
        .unwrap();
    // A service's login over the same multi-host URL.
    let relay = testkit::login_url(&url, Role::Relay).await;
    let outbox: i64 = testkit::TestDb::connect_url(&relay)
        .await
        .query_one("SELECT count(*) FROM public.outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(outbox, 0);
    drop(admin);

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let writers: Vec<_> = (1..=WRITERS)
        .map(|w| tokio::spawn(write(url.clone(), w, stop.clone(), acked.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = acked.lock().unwrap().len();
    assert!(before > 0, "no write before the kill");

    let killed = tokio::task::block_in_place(|| cluster.kill_primary_postmaster()).unwrap();
    let kill = Instant::now();
    let promoted =
        tokio::task::block_in_place(|| cluster.wait_for_new_primary(&killed.name, Duration::from_secs(30)))
            .unwrap();
    let promoted_after = kill.elapsed();
    // Writing again (a write acknowledged now is the new primary's: one
    // acknowledged just after the kill may have been the old one's, sent
    // before), then a little more.
    let promoted_at = Instant::now();
    let deadline = promoted_at + Duration::from_secs(30);
    while !acked.lock().unwrap().iter().any(|(_, at)| *at > promoted_at) {
        assert!(
            Instant::now() < deadline,
            "no write succeeded within 30 s of the promotion"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Release);
    for w in writers {
        w.await.unwrap();
    }

    let acked = std::mem::take(&mut *acked.lock().unwrap());
    // The window without a successful write: the longest gap between two
    // acknowledgements (of any writer), in seconds from the kill.
    let mut times: Vec<Instant> = acked.iter().map(|(_, at)| *at).collect();
    times.sort();
    let (gap_start, gap_end) = times
        .windows(2)
        .map(|w| (w[0], w[1]))
        .max_by_key(|(a, b)| *b - *a)
        .unwrap();
    let from_kill = |t: Instant| {
        if t >= kill {
            (t - kill).as_secs_f64()
        } else {
            -(kill - t).as_secs_f64()
        }
    };
    let client = testkit::TestDb::connect_url(&url).await;
    let port: i32 = client
        .query_one("SELECT inet_server_port()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(port, i32::from(promoted.port), "the URL reaches the new primary");
    let present: std::collections::HashSet<i64> = client
        .query("SELECT id FROM public.ha_probe", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let lost: Vec<i64> = acked
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| !present.contains(id))
        .collect();
    eprintln!(
        "ha_cluster: {} killed (postmaster {}), {} promoted {:.2} s after; no successful write for {:.2} s \
         (from {:+.2} s to {:+.2} s from the kill); {} acknowledged writes ({before} before the kill), {} rows \
         on the new primary, {} acknowledged missing\n{}",
        killed.name,
        killed.postmaster_pid,
        promoted.name,
        promoted_after.as_secs_f64(),
        (gap_end - gap_start).as_secs_f64(),
        from_kill(gap_start),
        from_kill(gap_end),
        acked.len(),
        present.len(),
        lost.len(),
        cluster.status()
    );
    assert_ne!(promoted.name, killed.name);
    assert!(
        lost.is_empty(),
        "synchronous replication lost {} acknowledged writes: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
}
