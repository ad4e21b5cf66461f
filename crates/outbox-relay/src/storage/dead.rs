//! Dead rows, for the operator: `dead list` and `dead requeue`.

use db::{Column, Executor, Sql, col};
use tokio_postgres::types::Type;

pub(crate) const DEAD_ROWS: Sql =
    Sql::new("outbox-relay/dead_rows.sql", include_str!("dead_rows.sql"), &[]).returning(DEAD_ROWS_COLUMNS);
const DEAD_ROWS_COLUMNS: &[Column] = &[
    col("id", Type::INT8),
    col("kind", Type::TEXT),
    col("idempotency_key", Type::TEXT),
    col("attempts", Type::INT4),
    col("last_error", Type::TEXT),
    col("age_seconds", Type::FLOAT8),
    col("event_id", Type::TEXT),
];

pub(crate) const REQUEUE_DEAD: Sql = Sql::new(
    "outbox-relay/requeue_dead.sql",
    include_str!("requeue_dead.sql"),
    &[Type::INT8, Type::TEXT],
)
.returning(REQUEUE_DEAD_COLUMNS);
const REQUEUE_DEAD_COLUMNS: &[Column] = &[col("requeued", Type::INT8), col("notified", Type::INT8)];

/// A dead row, for `dead list`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeadRow {
    pub id: i64,
    /// As the row has it: `dead list` shows a kind this release does not
    /// know as it is.
    pub kind: String,
    pub idempotency_key: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    /// Seconds since the row was enqueued (`age`, as `dead list --json` names it).
    #[serde(rename = "age")]
    pub age_seconds: f64,
    pub event_id: String,
}

pub async fn dead_rows(client: &(impl Executor + ?Sized)) -> Result<Vec<DeadRow>, tokio_postgres::Error> {
    let rows = DEAD_ROWS.query(client, &[]).await?;
    rows.into_iter()
        .map(|r| {
            Ok(DeadRow {
                id: r.try_get("id")?,
                kind: r.try_get("kind")?,
                idempotency_key: r.try_get("idempotency_key")?,
                attempts: r.try_get("attempts")?,
                last_error: r.try_get("last_error")?,
                age_seconds: r.try_get("age_seconds")?,
                event_id: r.try_get("event_id")?,
            })
        })
        .collect()
}

/// Dead rows back to pending, due now, attempts reset; `None` requeues all.
/// Notifies the relays in the same transaction. Returns the rows requeued.
pub async fn requeue_dead(
    client: &(impl Executor + ?Sized),
    id: Option<i64>,
) -> Result<u64, tokio_postgres::Error> {
    let row = REQUEUE_DEAD
        .query_one(client, &[&id, &db::NOTIFY_CHANNEL])
        .await?;
    Ok(row.try_get::<_, i64>("requeued")? as u64)
}
