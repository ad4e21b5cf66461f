//! One event's whole story, for `events show`: its row, and the commands of
//! its order with their state.

use db::{Column, Executor, Sql, col};
use domain::{CommandKind, EventOutcome};
use tokio_postgres::types::Type;

use super::outcome::StoredOutcome;

pub(crate) const SHOW_EVENT: Sql = Sql::new(
    "webhook-ingest/show_event.sql",
    include_str!("show_event.sql"),
    &[Type::TEXT],
)
.returning(SHOW_EVENT_COLUMNS);

const SHOW_EVENT_COLUMNS: &[Column] = &[
    col("event_id", Type::TEXT),
    col("event_type", Type::TEXT),
    col("status", Type::TEXT),
    col("processed_at", Type::TIMESTAMPTZ),
    col("last_delivered_at", Type::TIMESTAMPTZ),
    col("deliveries", Type::INT4),
    col("order_id", Type::INT8),
    col("result", Type::TEXT),
    col("payload", Type::TEXT),
    col("trace_context", Type::TEXT),
    col("discarded_reason", Type::TEXT),
    col("discarded_at", Type::TIMESTAMPTZ),
];

pub(crate) const ORDER_COMMANDS: Sql = Sql::new(
    "webhook-ingest/order_commands.sql",
    include_str!("order_commands.sql"),
    &[Type::TEXT_ARRAY],
)
.returning(ORDER_COMMANDS_COLUMNS);

const ORDER_COMMANDS_COLUMNS: &[Column] = &[
    col("id", Type::INT8),
    col("kind", Type::TEXT),
    col("event_id", Type::TEXT),
    col("status", Type::TEXT),
    col("attempts", Type::INT4),
    col("last_error", Type::TEXT),
    col("created_at", Type::TIMESTAMPTZ),
    col("available_at", Type::TIMESTAMPTZ),
    col("finished_at", Type::TIMESTAMPTZ),
    col("lease_owner", Type::TEXT),
    col("leased_until", Type::TIMESTAMPTZ),
    col("idempotency_key", Type::TEXT),
];

/// A recorded event, whole.
#[derive(Debug, Clone)]
pub struct EventDetail {
    pub event_id: String,
    pub event_type: String,
    pub status: EventOutcome,
    /// Its first delivery (the claim).
    pub processed_at: time::OffsetDateTime,
    pub last_delivered_at: time::OffsetDateTime,
    /// Deliveries of this id, the first included.
    pub deliveries: i32,
    pub order_id: Option<i64>,
    /// The answer every delivery of the id gets, byte for byte (JSON text).
    pub result: String,
    /// The event as delivered (JSON text).
    pub payload: Option<String>,
    /// The W3C `traceparent` of the request that recorded it.
    pub trace_context: Option<String>,
    /// Why and when an operator discarded it (`events discard`).
    pub discarded: Option<(String, time::OffsetDateTime)>,
}

/// One command of an order, as `events show` shows it (not what it sends).
#[derive(Debug, Clone)]
pub struct CommandRow {
    pub id: i64,
    pub kind: String,
    /// The event that enqueued it.
    pub event_id: String,
    pub status: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub created_at: time::OffsetDateTime,
    /// When it is next due (pending), or was last due.
    pub available_at: time::OffsetDateTime,
    pub finished_at: Option<time::OffsetDateTime>,
    /// The relay holding it, and until when (a call under way).
    pub lease_owner: Option<String>,
    pub leased_until: Option<time::OffsetDateTime>,
    pub idempotency_key: String,
}

/// The event recorded under `event_id`, if any.
pub async fn show_event(
    client: &(impl Executor + ?Sized),
    event_id: &str,
) -> Result<Option<EventDetail>, tokio_postgres::Error> {
    let Some(r) = SHOW_EVENT.query(client, &[&event_id]).await?.into_iter().next() else {
        return Ok(None);
    };
    Ok(Some(EventDetail {
        event_id: r.try_get("event_id")?,
        event_type: r.try_get("event_type")?,
        status: r.try_get::<_, StoredOutcome>("status")?.0,
        processed_at: r.try_get("processed_at")?,
        last_delivered_at: r.try_get("last_delivered_at")?,
        deliveries: r.try_get("deliveries")?,
        order_id: r.try_get("order_id")?,
        result: r.try_get("result")?,
        payload: r.try_get("payload")?,
        trace_context: r.try_get("trace_context")?,
        discarded: r
            .try_get::<_, Option<String>>("discarded_reason")?
            .zip(r.try_get::<_, Option<time::OffsetDateTime>>("discarded_at")?),
    }))
}

/// Every command of order `order_id`, oldest first: one per kind at most
/// (their idempotency keys), whichever event enqueued it.
pub async fn order_commands(
    client: &(impl Executor + ?Sized),
    order_id: i64,
) -> Result<Vec<CommandRow>, tokio_postgres::Error> {
    let keys: Vec<String> = CommandKind::ALL
        .iter()
        .map(|kind| kind.idempotency_key(order_id))
        .collect();
    let rows = ORDER_COMMANDS.query(client, &[&keys]).await?;
    rows.iter()
        .map(|r| {
            Ok(CommandRow {
                id: r.try_get("id")?,
                kind: r.try_get("kind")?,
                event_id: r.try_get("event_id")?,
                status: r.try_get("status")?,
                attempts: r.try_get("attempts")?,
                last_error: r.try_get("last_error")?,
                created_at: r.try_get("created_at")?,
                available_at: r.try_get("available_at")?,
                finished_at: r.try_get("finished_at")?,
                lease_owner: r.try_get("lease_owner")?,
                leased_until: r.try_get("leased_until")?,
                idempotency_key: r.try_get("idempotency_key")?,
            })
        })
        .collect()
}

pub(crate) const REPLAY_EVENT: Sql = Sql::new(
    "webhook-ingest/replay_event.sql",
    // With record_event.sql's steps (see build.rs).
    include_str!(concat!(env!("OUT_DIR"), "/replay_event.sql")),
    &[
        Type::TEXT, // event_id
        Type::TEXT, // payment_id
        Type::TEXT, // plan (JSON)
        Type::INT4, // payload_version
    ],
)
.returning(REPLAY_EVENT_COLUMNS);

const REPLAY_EVENT_COLUMNS: &[Column] = &[
    col("status", Type::TEXT),
    col("body", Type::TEXT),
    col("order_id", Type::INT8),
    col("enqueued", Type::INT4),
];

/// What a replay applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    /// The event's outcome now, and the answer later deliveries get.
    pub status: EventOutcome,
    pub body: String,
    pub order_id: i64,
    /// Commands enqueued (none when the order's state called for none, or
    /// they were enqueued already).
    pub enqueued: i32,
}

/// The event recorded under `event_id`, parsed again from its stored
/// `payload`; `None` when none was stored or it is another event's.
pub fn stored_event(event_id: &str, payload: Option<&str>) -> Option<domain::ProviderEvent> {
    payload
        .and_then(|payload| domain::ProviderEvent::parse(payload.as_bytes()).ok())
        .filter(|parsed| parsed.id == event_id)
}

/// Applies `event`, recorded `unmatched`, to the order that now has its
/// payment id (`replay_event.sql`). `None` when nothing was applied: the
/// event is no longer `unmatched` (replayed already, by this or a racing
/// replay), or still no order has its payment id.
pub async fn replay_event(
    client: &(impl Executor + ?Sized),
    event: &domain::ProviderEvent,
) -> Result<Option<Replayed>, tokio_postgres::Error> {
    let plan = super::plan::Plan::of_kind(event.kind);
    let rows = REPLAY_EVENT
        .query(
            client,
            &[&event.id, &event.payment_id, &plan.json, &domain::PAYLOAD_VERSION],
        )
        .await?;
    rows.first()
        .map(|r| {
            Ok(Replayed {
                status: r.try_get::<_, StoredOutcome>("status")?.0,
                body: r.try_get("body")?,
                order_id: r.try_get("order_id")?,
                enqueued: r.try_get("enqueued")?,
            })
        })
        .transpose()
}
