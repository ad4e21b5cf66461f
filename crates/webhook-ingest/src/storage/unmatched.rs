//! Events recorded `unmatched`: the ones the reconciler can now apply, the
//! gauges of those left, and an operator's discard.

use db::{Column, Executor, Sql, col};
use tokio_postgres::types::Type;

pub(crate) const MATCHABLE_EVENTS: Sql = Sql::new(
    "webhook-ingest/matchable_events.sql",
    include_str!("matchable_events.sql"),
    &[Type::TIMESTAMPTZ, Type::INT8],
)
.returning(MATCHABLE_EVENTS_COLUMNS);

const MATCHABLE_EVENTS_COLUMNS: &[Column] = &[col("event_id", Type::TEXT), col("payload", Type::TEXT)];

pub(crate) const UNMATCHED_BACKLOG: Sql = Sql::new(
    "webhook-ingest/unmatched_backlog.sql",
    include_str!("unmatched_backlog.sql"),
    &[Type::TIMESTAMPTZ, Type::INT8],
)
.returning(UNMATCHED_BACKLOG_COLUMNS);

const UNMATCHED_BACKLOG_COLUMNS: &[Column] =
    &[col("oldest", Type::TIMESTAMPTZ), col("past_horizon", Type::INT8)];

pub(crate) const DISCARD_EVENT: Sql = Sql::new(
    "webhook-ingest/discard_event.sql",
    include_str!("discard_event.sql"),
    &[Type::TEXT, Type::TEXT],
)
.returning(DISCARD_EVENT_COLUMNS);

const DISCARD_EVENT_COLUMNS: &[Column] = &[
    col("event_id", Type::TEXT),
    col("discarded_at", Type::TIMESTAMPTZ),
];

/// An `unmatched` event whose payment id an order now has, with its stored
/// payload (JSON text) to apply it from.
#[derive(Debug, Clone)]
pub struct Matchable {
    pub event_id: String,
    pub payload: Option<String>,
}

/// At most `limit` unmatched events first delivered since `since` whose
/// order now exists, oldest first.
pub async fn matchable_events(
    client: &(impl Executor + ?Sized),
    since: time::OffsetDateTime,
    limit: i64,
) -> Result<Vec<Matchable>, tokio_postgres::Error> {
    MATCHABLE_EVENTS
        .query(client, &[&since, &limit])
        .await?
        .iter()
        .map(|r| {
            Ok(Matchable {
                event_id: r.try_get("event_id")?,
                payload: r.try_get("payload")?,
            })
        })
        .collect()
}

/// The unmatched events at one moment: the first delivery of the oldest,
/// and how many (at most `cap`) were first delivered before `horizon`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnmatchedBacklog {
    pub oldest: Option<time::OffsetDateTime>,
    pub past_horizon: i64,
}

pub async fn unmatched_backlog(
    client: &(impl Executor + ?Sized),
    horizon: time::OffsetDateTime,
    cap: i64,
) -> Result<UnmatchedBacklog, tokio_postgres::Error> {
    let row = UNMATCHED_BACKLOG.query_one(client, &[&horizon, &cap]).await?;
    Ok(UnmatchedBacklog {
        oldest: row.try_get("oldest")?,
        past_horizon: row.try_get("past_horizon")?,
    })
}

/// Marks `event_id` `discarded` with `reason`, if it is still `unmatched`;
/// when it did, the time it was discarded.
pub async fn discard_event(
    client: &(impl Executor + ?Sized),
    event_id: &str,
    reason: &str,
) -> Result<Option<time::OffsetDateTime>, tokio_postgres::Error> {
    DISCARD_EVENT
        .query(client, &[&event_id, &reason])
        .await?
        .first()
        .map(|r| r.try_get("discarded_at"))
        .transpose()
}
