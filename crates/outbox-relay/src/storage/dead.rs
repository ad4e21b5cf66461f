//! Dead rows, for the operator: `dead list`, `dead show`, `dead requeue`
//! and `dead discard`.

use db::{Column, Executor, Sql, col};
use time::OffsetDateTime;
use tokio_postgres::types::Type;

pub(crate) const DEAD_ROWS: Sql = Sql::new(
    "outbox-relay/dead_rows.sql",
    include_str!("dead_rows.sql"),
    &[Type::TEXT, Type::INT8, Type::INT8],
)
.returning(DEAD_ROWS_COLUMNS);
const DEAD_ROWS_COLUMNS: &[Column] = &[
    col("id", Type::INT8),
    col("kind", Type::TEXT),
    col("idempotency_key", Type::TEXT),
    col("event_id", Type::TEXT),
    col("order_id", Type::INT8),
    col("attempts", Type::INT4),
    col("last_error", Type::TEXT),
    col("finished_at", Type::TIMESTAMPTZ),
    col("age_seconds", Type::FLOAT8),
    col("total", Type::INT8),
];

pub(crate) const OUTBOX_ROW: Sql = Sql::new(
    "outbox-relay/outbox_row.sql",
    include_str!("outbox_row.sql"),
    &[Type::INT8],
)
.returning(OUTBOX_ROW_COLUMNS);
const OUTBOX_ROW_COLUMNS: &[Column] = &[
    col("id", Type::INT8),
    col("kind", Type::TEXT),
    col("idempotency_key", Type::TEXT),
    col("event_id", Type::TEXT),
    col("order_id", Type::INT8),
    col("status", Type::TEXT),
    col("attempts", Type::INT4),
    col("claims", Type::INT4),
    col("last_error", Type::TEXT),
    col("payload", Type::TEXT),
    col("trace_context", Type::TEXT),
    col("created_at", Type::TIMESTAMPTZ),
    col("available_at", Type::TIMESTAMPTZ),
    col("finished_at", Type::TIMESTAMPTZ),
    col("lease_owner", Type::TEXT),
    col("leased_until", Type::TIMESTAMPTZ),
];

pub(crate) const REQUEUE_DEAD: Sql = Sql::new(
    "outbox-relay/requeue_dead.sql",
    include_str!("requeue_dead.sql"),
    &[Type::INT8, Type::TEXT, Type::TEXT, Type::BOOL],
)
.returning(REQUEUE_DEAD_COLUMNS);
const REQUEUE_DEAD_COLUMNS: &[Column] = &[
    col("id", Type::INT8),
    col("kind", Type::TEXT),
    col("idempotency_key", Type::TEXT),
    col("attempts", Type::INT4),
    col("last_error", Type::TEXT),
    col("notified", Type::INT8),
];

pub(crate) const DISCARD_DEAD: Sql = Sql::new(
    "outbox-relay/discard_dead.sql",
    include_str!("discard_dead.sql"),
    &[Type::INT8, Type::TEXT],
)
.returning(DISCARD_DEAD_COLUMNS);
const DISCARD_DEAD_COLUMNS: &[Column] = &[
    col("id", Type::INT8),
    col("kind", Type::TEXT),
    col("idempotency_key", Type::TEXT),
    col("event_id", Type::TEXT),
    col("order_id", Type::INT8),
    col("attempts", Type::INT4),
    col("last_error", Type::TEXT),
];

/// A dead row, for `dead list`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeadRow {
    pub id: i64,
    /// As the row has it: `dead list` shows a kind this release does not
    /// know as it is.
    pub kind: String,
    pub idempotency_key: String,
    pub event_id: String,
    pub order_id: i64,
    pub attempts: i32,
    pub last_error: Option<String>,
    /// When it died.
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
    /// Seconds since the row was enqueued (`age`, as `dead list --json` names it).
    #[serde(rename = "age")]
    pub age_seconds: f64,
}

/// A page of dead rows, and how many match in all.
#[derive(Debug, Clone)]
pub struct DeadPage {
    pub rows: Vec<DeadRow>,
    pub total: i64,
}

/// Which dead rows `dead list` shows.
#[derive(Debug, Clone)]
pub struct DeadFilter {
    pub kind: Option<String>,
    pub limit: i64,
    pub after: Option<i64>,
}

pub async fn dead_rows(
    client: &(impl Executor + ?Sized),
    filter: &DeadFilter,
) -> Result<DeadPage, tokio_postgres::Error> {
    let rows = DEAD_ROWS
        .query(client, &[&filter.kind, &filter.limit, &filter.after])
        .await?;
    let total = rows.first().map_or(Ok(0), |r| r.try_get("total"))?;
    let rows = rows
        .into_iter()
        .map(|r| {
            Ok(DeadRow {
                id: r.try_get("id")?,
                kind: r.try_get("kind")?,
                idempotency_key: r.try_get("idempotency_key")?,
                event_id: r.try_get("event_id")?,
                order_id: r.try_get("order_id")?,
                attempts: r.try_get("attempts")?,
                last_error: r.try_get("last_error")?,
                finished_at: r.try_get("finished_at")?,
                age_seconds: r.try_get("age_seconds")?,
            })
        })
        .collect::<Result<_, tokio_postgres::Error>>()?;
    Ok(DeadPage { rows, total })
}

/// One outbox row, whole, for `dead show` (of any status).
#[derive(Debug, Clone, serde::Serialize)]
pub struct OutboxRow {
    pub id: i64,
    pub kind: String,
    pub idempotency_key: String,
    pub event_id: String,
    pub order_id: i64,
    pub status: String,
    pub attempts: i32,
    pub claims: i32,
    pub last_error: Option<String>,
    /// The body the downstream is sent, as stored.
    pub payload: String,
    pub trace_context: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub available_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
    pub lease_owner: Option<String>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub leased_until: Option<OffsetDateTime>,
}

pub async fn outbox_row(
    client: &(impl Executor + ?Sized),
    id: i64,
) -> Result<Option<OutboxRow>, tokio_postgres::Error> {
    let rows = OUTBOX_ROW.query(client, &[&id]).await?;
    rows.first()
        .map(|r| {
            Ok(OutboxRow {
                id: r.try_get("id")?,
                kind: r.try_get("kind")?,
                idempotency_key: r.try_get("idempotency_key")?,
                event_id: r.try_get("event_id")?,
                order_id: r.try_get("order_id")?,
                status: r.try_get("status")?,
                attempts: r.try_get("attempts")?,
                claims: r.try_get("claims")?,
                last_error: r.try_get("last_error")?,
                payload: r.try_get("payload")?,
                trace_context: r.try_get("trace_context")?,
                created_at: r.try_get("created_at")?,
                available_at: r.try_get("available_at")?,
                finished_at: r.try_get("finished_at")?,
                lease_owner: r.try_get("lease_owner")?,
                leased_until: r.try_get("leased_until")?,
            })
        })
        .transpose()
}

/// A dead row `dead requeue` put back (or, dry, would put back), as it was.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Requeued {
    pub id: i64,
    pub kind: String,
    pub idempotency_key: String,
    /// The attempts it had made (reset to 0 by the requeue).
    pub attempts: i32,
    pub last_error: Option<String>,
}

/// Which dead rows `dead requeue` puts back: one (`id`), or every one
/// (`None`), of one kind or all; `dry_run` changes nothing.
#[derive(Debug, Clone, Default)]
pub struct RequeueFilter {
    pub id: Option<i64>,
    pub kind: Option<String>,
    pub dry_run: bool,
}

/// Dead rows back to pending, due now, attempts reset; the relays notified
/// in the same transaction. Returns the rows requeued, oldest first (with
/// `dry_run`, the rows that would be, and nothing changes).
pub async fn requeue_dead(
    client: &(impl Executor + ?Sized),
    filter: &RequeueFilter,
) -> Result<Vec<Requeued>, tokio_postgres::Error> {
    let rows = REQUEUE_DEAD
        .query(
            client,
            &[&filter.id, &filter.kind, &db::NOTIFY_CHANNEL, &filter.dry_run],
        )
        .await?;
    rows.into_iter()
        .map(|r| {
            Ok(Requeued {
                id: r.try_get("id")?,
                kind: r.try_get("kind")?,
                idempotency_key: r.try_get("idempotency_key")?,
                attempts: r.try_get("attempts")?,
                last_error: r.try_get("last_error")?,
            })
        })
        .collect()
}

/// A dead row `dead discard` ended, as it is now.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Discarded {
    pub id: i64,
    pub kind: String,
    pub idempotency_key: String,
    pub event_id: String,
    pub order_id: i64,
    pub attempts: i32,
    /// The reason, and the error it died of.
    pub last_error: Option<String>,
}

/// A dead row ended as `cancelled`, with the operator's reason; `None` when
/// the row is not dead (or does not exist): nothing changed.
pub async fn discard_dead(
    client: &(impl Executor + ?Sized),
    id: i64,
    reason: &str,
) -> Result<Option<Discarded>, tokio_postgres::Error> {
    let rows = DISCARD_DEAD.query(client, &[&id, &reason]).await?;
    rows.first()
        .map(|r| {
            Ok(Discarded {
                id: r.try_get("id")?,
                kind: r.try_get("kind")?,
                idempotency_key: r.try_get("idempotency_key")?,
                event_id: r.try_get("event_id")?,
                order_id: r.try_get("order_id")?,
                attempts: r.try_get("attempts")?,
                last_error: r.try_get("last_error")?,
            })
        })
        .transpose()
}
