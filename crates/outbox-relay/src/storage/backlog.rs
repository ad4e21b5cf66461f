//! Counting rows: the backlog gauges, `stats`, and the autoscaler's count of
//! due rows.

use db::{Column, Executor, Sql, col};
use tokio_postgres::types::Type;

pub(crate) const BACKLOG: Sql =
    Sql::new("outbox-relay/backlog.sql", include_str!("backlog.sql"), &[]).returning(BACKLOG_COLUMNS);
const BACKLOG_COLUMNS: &[Column] = &[
    col("pending", Type::INT8),
    col("oldest_pending_age_seconds", Type::FLOAT8),
    col("dead", Type::INT8),
];

pub(crate) const BACKLOG_DUE: Sql = Sql::new(
    "outbox-relay/backlog_due.sql",
    include_str!("backlog_due.sql"),
    &[],
)
.returning(BACKLOG_DUE_COLUMNS);
const BACKLOG_DUE_COLUMNS: &[Column] = &[col("due", Type::INT8)];

pub(crate) const COUNTS_BY_STATUS_AND_KIND: Sql = Sql::new(
    "outbox-relay/counts_by_status_and_kind.sql",
    include_str!("counts_by_status_and_kind.sql"),
    &[],
)
.returning(COUNTS_BY_STATUS_AND_KIND_COLUMNS);
const COUNTS_BY_STATUS_AND_KIND_COLUMNS: &[Column] = &[
    col("status", Type::TEXT),
    col("kind", Type::TEXT),
    col("row_count", Type::INT8),
];

/// Due rows (pending, due, not leased), counted as the KEDA autoscaler counts
/// them: `deploy/` carries this very text, and `deploy-check` holds the two
/// equal, which is why the file lives apart (`crates/outbox-relay/sql/`) and
/// has neither a comment nor a column name of its own. The relay does not run
/// it; the autoscaler does, as the `outbox_monitor` role.
pub const COUNT_DUE: Sql = Sql::new(
    "outbox-relay/count_due.sql",
    include_str!("../../sql/count_due.sql"),
    &[],
)
.returning(COUNT_DUE_COLUMNS);
const COUNT_DUE_COLUMNS: &[Column] = &[col("count", Type::INT8)];

/// The most `pending` and `due` read: counting further would scan the whole
/// backlog every refresh, on every pod (`backlog.sql` and `backlog_due.sql`
/// hold the same number).
pub const BACKLOG_COUNT_CAP: i64 = 100_000;

/// Database-derived gauges.
#[derive(Debug, Clone, Copy, Default)]
pub struct Backlog {
    pub pending: i64,
    pub oldest_pending_age_seconds: f64,
    pub dead: i64,
}

/// Counts for the gauges: served by the partial indexes and bounded, cheap
/// at any size of history or backlog. `pending` is counted up to
/// [`BACKLOG_COUNT_CAP`]; the age is that of the pending row next in line
/// (the first entry of the due index), not a scan for the oldest.
pub async fn backlog(client: &(impl Executor + ?Sized)) -> Result<Backlog, tokio_postgres::Error> {
    let row = BACKLOG.query_one(client, &[]).await?;
    Ok(Backlog {
        pending: row.try_get("pending")?,
        oldest_pending_age_seconds: row.try_get("oldest_pending_age_seconds")?,
        dead: row.try_get("dead")?,
    })
}

/// Rows due now (pending, due, not leased), counted up to
/// [`BACKLOG_COUNT_CAP`]: for `stats` and the console, not the gauges (a
/// count that reads each due row's heap tuple, which every relay would run
/// every 5 s for a figure no gauge shows).
pub async fn backlog_due(client: &(impl Executor + ?Sized)) -> Result<i64, tokio_postgres::Error> {
    BACKLOG_DUE.query_one(client, &[]).await?.try_get("due")
}

/// One line of `stats`: how many rows have this status and kind. Both are
/// shown as the rows have them (a kind this release does not know included).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StatusKindCount {
    pub status: String,
    pub kind: String,
    pub count: i64,
}

/// Rows by status and kind, in that order.
pub async fn counts_by_status_and_kind(
    client: &(impl Executor + ?Sized),
) -> Result<Vec<StatusKindCount>, tokio_postgres::Error> {
    let rows = COUNTS_BY_STATUS_AND_KIND.query(client, &[]).await?;
    rows.into_iter()
        .map(|r| {
            Ok(StatusKindCount {
                status: r.try_get("status")?,
                kind: r.try_get("kind")?,
                count: r.try_get("row_count")?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_statement_counts_up_to_the_documented_cap() {
        let limit = format!("LIMIT {}", super::BACKLOG_COUNT_CAP);
        assert_eq!(include_str!("backlog.sql").matches(&limit).count(), 1);
        assert_eq!(include_str!("backlog_due.sql").matches(&limit).count(), 1);
    }
}
