//! All of the ingest's SQL. Each statement is a `.sql` file in this
//! directory; [`STATEMENTS`] lists them all.
//!
//! [`record_event`] is the product's core: ONE statement, so ONE round trip
//! and ONE transaction (autocommit), that
//! 1. locks the event's order, if any (`FOR UPDATE`: concurrent events for one
//!    order serialise here, so each sees the state the previous one left);
//! 2. claims the event id by inserting it (`ON CONFLICT` on the primary key: an
//!    atomic test-and-set, no read-then-write); a conflict instead counts the
//!    delivery and returns the stored result for a byte-identical replay;
//! 3. only when claimed: changes the order, stops its unsent shipment (on a
//!    refund) and inserts the outbox rows, all of which become visible when,
//!    and only when, the claim commits.
//!
//! The business rule is not in this SQL: [`domain::transition`] is evaluated
//! for every state the order may be in, up front, and passed in as the
//! statement's `plan`, an object keyed by the state's name (see `plan.rs`);
//! the statement takes the entry for the state it finds under lock.
//!
//! Each event kind runs the smallest statement that does its work
//! (`plan::Shape`): `record_event.sql` (payments), the same with its
//! `steps/stop_shipment.sql` step (refunds), or `record_claim_only.sql` (types
//! we ignore). Executor start-up is a large share of the database's work per
//! webhook, and it grows with every node in the plan, so no statement carries
//! steps its events never take. The steps that apply a claimed event
//! (`steps/`) are written once: `build.rs` includes them in the payment's and
//! the refund's statements and in `replay_event.sql`.
//!
//! The relays are woken by [`wake_relays`] just after the commit, not by a
//! `NOTIFY` inside the transaction: Postgres serialises every notifying
//! transaction through its commit on one global lock, WAL flush included, so
//! a `NOTIFY` per event caps the ingest at one flush at a time (measured here:
//! the reference one-statement ingest fell from 4,100-4,700 to 280-820
//! transactions/s at 64 clients with a `pg_notify` added). See
//! [`crate::notifier`].

mod outcome;
mod plan;
mod record;
mod story;
mod unmatched;

use db::{Column, Executor, Sql, col};
use domain::EventOutcome;
use outcome::StoredOutcome;
use tokio_postgres::types::Type;

pub use record::{
    Delivery, Pending, Recorded, batchable, record_batch_span, record_event, record_events, record_span,
};
pub use story::{CommandRow, EventDetail, Replayed, order_commands, replay_event, show_event, stored_event};
pub use unmatched::{Matchable, UnmatchedBacklog, discard_event, matchable_events, unmatched_backlog};

/// Every statement the ingest runs, for the test that prepares each against
/// the migrated schema.
pub const STATEMENTS: &[&Sql] = &[
    &record::RECORD_EVENT,
    &record::RECORD_EVENT_STOPPING_SHIPMENT,
    &record::RECORD_CLAIM_ONLY,
    &record::RECORD_EVENTS_BATCH,
    &WAKE_RELAYS,
    &LIST_EVENTS,
    &story::SHOW_EVENT,
    &story::ORDER_COMMANDS,
    &story::REPLAY_EVENT,
    &unmatched::MATCHABLE_EVENTS,
    &unmatched::UNMATCHED_BACKLOG,
    &unmatched::DISCARD_EVENT,
];

/// The statements of [`STATEMENTS`] the operator's console runs too, as its
/// own role (`ops_console`): an event's story, the unmatched backlog, replay
/// and discard.
pub const CONSOLE_STATEMENTS: &[&Sql] = &[
    &WAKE_RELAYS,
    &LIST_EVENTS,
    &story::SHOW_EVENT,
    &story::ORDER_COMMANDS,
    &story::REPLAY_EVENT,
    &unmatched::UNMATCHED_BACKLOG,
    &unmatched::DISCARD_EVENT,
];

/// Opens every connection of `pool` with the ingest's statements prepared
/// ([`db::Pool::open_all`]) and runs the batch statement once on each with
/// no event in it (it writes nothing): each session has then read the
/// tables' and indexes' catalog entries and planned the statement most
/// payments go through. Measured: an ingest whose sessions were new
/// answered its first seconds at 2,500 req/s with a p99 of 35-100 ms,
/// against 9-16 ms for the same load a moment later. Returns how many
/// connections it warmed.
pub async fn warm(pool: &db::Pool) -> Result<usize, db::PoolError> {
    let clients = pool.open_all(STATEMENTS).await?;
    for client in &clients {
        record_events(client, &[]).await?;
    }
    Ok(clients.len())
}

/// Wakes the relays: a `NOTIFY` on [`db::NOTIFY_CHANNEL`] in a transaction
/// of its own, committed without waiting for the WAL flush.
const WAKE_RELAYS: Sql = Sql::new(
    "webhook-ingest/wake_relays.sql",
    include_str!("wake_relays.sql"),
    &[Type::TEXT],
)
.returning(WAKE_RELAYS_COLUMNS);

const WAKE_RELAYS_COLUMNS: &[Column] = &[col("synchronous_commit", Type::TEXT), col("notified", Type::VOID)];

pub async fn wake_relays(client: &impl Executor) -> Result<(), tokio_postgres::Error> {
    WAKE_RELAYS
        .execute(client, &[&db::NOTIFY_CHANNEL])
        .await
        .map(|_| ())
}

/// One recorded event, as `events list` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EventRow {
    pub event_id: String,
    pub event_type: String,
    pub status: EventOutcome,
    #[serde(with = "time::serde::rfc3339")]
    pub processed_at: time::OffsetDateTime,
    pub deliveries: i32,
    pub order_id: Option<i64>,
    pub payload: Option<serde_json::Value>,
}

const LIST_EVENTS: Sql = Sql::new(
    "webhook-ingest/list_events.sql",
    include_str!("list_events.sql"),
    &[
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::FLOAT8,
        Type::TEXT,
        Type::INT8,
    ],
)
.returning(LIST_EVENTS_COLUMNS);

const LIST_EVENTS_COLUMNS: &[Column] = &[
    col("event_id", Type::TEXT),
    col("event_type", Type::TEXT),
    col("status", Type::TEXT),
    col("processed_at", Type::TIMESTAMPTZ),
    col("deliveries", Type::INT4),
    col("order_id", Type::INT8),
    col("payload", Type::JSONB),
];

/// Which events `events list` shows; every filter is optional.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub status: Option<EventOutcome>,
    /// This id exactly.
    pub id: Option<String>,
    /// Ids that start with this.
    pub id_prefix: Option<String>,
    /// Processed this recently.
    pub since: Option<std::time::Duration>,
    /// The page after this event (newest first: older, or as old with a
    /// greater id).
    pub after: Option<String>,
    pub limit: i64,
}

/// Recorded events, newest first, as `filter` says.
pub async fn list_events(
    client: &(impl Executor + ?Sized),
    filter: &EventFilter,
) -> Result<Vec<EventRow>, tokio_postgres::Error> {
    let since = filter.since.map(|d| d.as_secs_f64());
    let rows = LIST_EVENTS
        .query(
            client,
            &[
                &filter.status.map(EventOutcome::as_str),
                &filter.id,
                &filter.id_prefix,
                &since,
                &filter.after,
                &filter.limit,
            ],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(EventRow {
                event_id: r.try_get("event_id")?,
                event_type: r.try_get("event_type")?,
                status: r.try_get::<_, StoredOutcome>("status")?.0,
                processed_at: r.try_get("processed_at")?,
                deliveries: r.try_get("deliveries")?,
                order_id: r.try_get("order_id")?,
                payload: r.try_get("payload")?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relays_are_woken_outside_the_claim_on_a_channel_passed_in() {
        assert!(WAKE_RELAYS.text.contains("pg_notify($1, '')"));
        for sql in STATEMENTS {
            assert!(
                !sql.text.contains(db::NOTIFY_CHANNEL),
                "{}: the channel is a parameter",
                sql.name
            );
        }
        for sql in [
            &record::RECORD_EVENT,
            &record::RECORD_EVENT_STOPPING_SHIPMENT,
            &record::RECORD_CLAIM_ONLY,
        ] {
            assert!(
                !sql.text.contains("pg_notify"),
                "{}: a NOTIFY in the claim serialises commits",
                sql.name
            );
        }
    }

    #[test]
    fn every_statement_declares_a_type_per_parameter() {
        for sql in STATEMENTS {
            assert_eq!(sql.placeholders(), sql.types.len(), "{}", sql.name);
        }
    }
}
