//! What `audit` reads from the database over a window: deliveries, events by
//! status, commands by kind and status.

use std::time::Duration;

use db::{Column, Executor, Sql, col};
use tokio_postgres::types::Type;

pub(crate) const AUDIT_TOTALS: Sql = Sql::new(
    "outbox-relay/audit_totals.sql",
    include_str!("audit_totals.sql"),
    &[Type::FLOAT8],
)
.returning(AUDIT_TOTALS_COLUMNS);
const AUDIT_TOTALS_COLUMNS: &[Column] = &[col("distinct_events", Type::INT8), col("deliveries", Type::INT8)];

pub(crate) const AUDIT_BY_STATUS: Sql = Sql::new(
    "outbox-relay/audit_by_status.sql",
    include_str!("audit_by_status.sql"),
    &[Type::FLOAT8],
)
.returning(AUDIT_BY_STATUS_COLUMNS);
const AUDIT_BY_STATUS_COLUMNS: &[Column] = &[col("status", Type::TEXT), col("events", Type::INT8)];

pub(crate) const AUDIT_COMMANDS: Sql = Sql::new(
    "outbox-relay/audit_commands.sql",
    include_str!("audit_commands.sql"),
    &[Type::FLOAT8],
)
.returning(AUDIT_COMMANDS_COLUMNS);
const AUDIT_COMMANDS_COLUMNS: &[Column] = &[
    col("kind", Type::TEXT),
    col("status", Type::TEXT),
    col("row_count", Type::INT8),
];

pub(crate) const AUDIT_DOUBLED: Sql = Sql::new(
    "outbox-relay/audit_doubled.sql",
    include_str!("audit_doubled.sql"),
    &[Type::FLOAT8],
)
.returning(AUDIT_DOUBLED_COLUMNS);
const AUDIT_DOUBLED_COLUMNS: &[Column] = &[col("doubled", Type::INT8)];

/// What `audit` reports from the database, over a window.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Audit {
    pub since_seconds: u64,
    /// Deliveries received for events first processed in the window.
    pub deliveries: i64,
    pub distinct_events: i64,
    pub duplicate_deliveries: i64,
    /// Events by recorded status (processed, refunded, unmatched, ...).
    pub events_by_status: Vec<(String, i64)>,
    /// Outbox rows created in the window, by kind and status.
    pub commands: Vec<(String, String, i64)>,
    /// (kind, order) pairs with more than one row: zero by construction (the
    /// idempotency key is unique); counted so a report can say so.
    pub double_enqueued: i64,
}

pub async fn audit(
    client: &(impl Executor + ?Sized),
    since: Duration,
) -> Result<Audit, tokio_postgres::Error> {
    let secs = since.as_secs_f64();
    let totals = AUDIT_TOTALS.query_one(client, &[&secs]).await?;
    let by_status = AUDIT_BY_STATUS.query(client, &[&secs]).await?;
    let commands = AUDIT_COMMANDS.query(client, &[&secs]).await?;
    let doubled = AUDIT_DOUBLED.query_one(client, &[&secs]).await?;
    let distinct_events: i64 = totals.try_get("distinct_events")?;
    let deliveries: i64 = totals.try_get("deliveries")?;
    Ok(Audit {
        since_seconds: since.as_secs(),
        deliveries,
        distinct_events,
        duplicate_deliveries: deliveries - distinct_events,
        events_by_status: by_status
            .iter()
            .map(|r| Ok((r.try_get("status")?, r.try_get("events")?)))
            .collect::<Result<_, tokio_postgres::Error>>()?,
        commands: commands
            .iter()
            .map(|r| Ok((r.try_get("kind")?, r.try_get("status")?, r.try_get("row_count")?)))
            .collect::<Result<_, tokio_postgres::Error>>()?,
        double_enqueued: doubled.try_get("doubled")?,
    })
}
