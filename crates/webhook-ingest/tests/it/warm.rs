//! The first ready answer comes with the pool warm: every connection open,
//! its statements prepared and its session's first plan made, so traffic
//! sent on it queues behind no login.

use crate::helpers::spawn_app_with;

#[tokio::test]
async fn the_first_ready_answer_comes_with_every_pooled_connection_open() {
    let app = spawn_app_with(&["--database-pool-size", "5"]).await;
    let sessions = || async {
        let row = app
            .client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND application_name = 'webhook-ingest'",
                &[],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0)
    };
    let (status, reason) = app.readyz().await;
    assert_eq!(status, 200, "{reason}");
    assert_eq!(
        sessions().await,
        5,
        "every connection of the pool is open once ready"
    );
    // Warmed once: later probes neither open nor hold more.
    assert_eq!(app.readyz().await.0, 200);
    assert_eq!(sessions().await, 5);
}
