//! Reading a count, and waiting for one: how a test observes work that
//! another process does in its own time. Waiting polls until the count is
//! reached; the timeout only bounds a test that would otherwise hang.

use std::time::{Duration, Instant};

/// How often [`wait_for_count`] reads again.
const POLL_EVERY: Duration = Duration::from_millis(50);

/// `sql`, a single count, read once.
pub async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0)
}

/// Polls `sql` (a count) every 50 ms until it reads `target`; panics with
/// the last reading after `timeout`.
pub async fn wait_for_count(client: &tokio_postgres::Client, sql: &str, target: i64, timeout: Duration) {
    let started = Instant::now();
    loop {
        let n = count(client, sql).await;
        if n == target {
            return;
        }
        assert!(
            started.elapsed() < timeout,
            "{sql}: {n}, expected {target} within {timeout:?}"
        );
        tokio::time::sleep(POLL_EVERY).await;
    }
}
