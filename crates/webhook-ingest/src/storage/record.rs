//! Recording one delivery: the claim-and-apply statement an event's kind
//! needs (see [`Shape`]), one round trip, and its answer decoded.

use db::span::Summary;
use db::{Sql, col};
use domain::{EventOutcome, PAYLOAD_VERSION, ProviderEvent};
use tokio_postgres::Row;
use tokio_postgres::types::Type;

use super::outcome::StoredOutcome;
use super::plan::{Plan, Shape};

/// What every record statement returns.
const RECORDED: &[db::Column] = &[
    col("claimed", Type::BOOL),
    col("body", Type::TEXT),
    col("status", Type::TEXT),
    col("enqueued", Type::INT4),
];

/// Claim, change the order, enqueue: events that stop nothing (payments).
/// `record_event.sql` without its `(refunds)` step (see `build.rs`).
pub(super) const RECORD_EVENT: Sql = Sql::new(
    "webhook-ingest/record_event.sql",
    include_str!(concat!(env!("OUT_DIR"), "/record_event.sql")),
    &[
        Type::TEXT, // event_id
        Type::TEXT, // event_type
        Type::TEXT, // payment_id
        Type::TEXT, // plan (JSON)
        Type::TEXT, // body (JSON)
        Type::TEXT, // trace_context
        Type::INT4, // payload_version
    ],
)
.returning(RECORDED);

/// The same, and stop the order's shipment (refunds): `record_event.sql`
/// with its `(refunds)` step, `steps/stop_shipment.sql`.
pub(super) const RECORD_EVENT_STOPPING_SHIPMENT: Sql = Sql::new(
    "webhook-ingest/record_event.sql (refunds)",
    include_str!(concat!(env!("OUT_DIR"), "/record_event_stopping_shipment.sql")),
    RECORD_EVENT.types,
)
.returning(RECORDED);

/// The claim alone (types we ignore).
pub(super) const RECORD_CLAIM_ONLY: Sql = Sql::new(
    "webhook-ingest/record_claim_only.sql",
    include_str!("record_claim_only.sql"),
    &[Type::TEXT, Type::TEXT, Type::TEXT, Type::TEXT, Type::TEXT],
)
.returning(RECORDED);

/// What the batch statement returns: each row names its event by `n`, its
/// place (from 1) in the batch.
const RECORDED_IN_BATCH: &[db::Column] = &[
    col("n", Type::INT4),
    col("claimed", Type::BOOL),
    col("body", Type::TEXT),
    col("status", Type::TEXT),
    col("enqueued", Type::INT4),
];

/// Claim, change the order, enqueue, for several payments at once
/// (`record_events_batch.sql`; see `crate::batch`).
pub(super) const RECORD_EVENTS_BATCH: Sql = Sql::new(
    "webhook-ingest/record_events_batch.sql",
    include_str!("record_events_batch.sql"),
    &[
        Type::TEXT_ARRAY, // event_id
        Type::TEXT_ARRAY, // event_type
        Type::TEXT_ARRAY, // payment_id
        Type::TEXT_ARRAY, // plan (JSON)
        Type::TEXT_ARRAY, // body (JSON)
        Type::TEXT_ARRAY, // trace_context
        Type::INT4,       // payload_version
    ],
)
.returning(RECORDED_IN_BATCH);

/// What each record statement does, as its client span names it (see
/// `db::span`): every operation on a table, in the order its text names them.
const RECORD_EVENT_SUMMARY: Summary = Summary::of(
    "UPDATE public.processed_events SELECT public.orders INSERT public.processed_events \
     UPDATE public.orders INSERT public.outbox",
);
const RECORD_EVENT_STOPPING_SHIPMENT_SUMMARY: Summary = Summary::of(
    "UPDATE public.processed_events SELECT public.orders INSERT public.processed_events \
     UPDATE public.orders INSERT public.outbox INSERT public.outbox",
);
const RECORD_CLAIM_ONLY_SUMMARY: Summary = Summary::single(
    "INSERT public.processed_events",
    "INSERT",
    "public.processed_events",
);
const RECORD_EVENTS_BATCH_SUMMARY: Summary = Summary::of(
    "UPDATE public.processed_events SELECT public.orders SELECT public.orders \
     INSERT public.processed_events UPDATE public.orders INSERT public.outbox",
);

/// The client span of the statement [`record_event`] runs for `event`, to
/// `server`, under the delivery's span `parent`.
pub fn record_span(
    parent: &tracing::Span,
    server: &db::span::Server,
    event: &ProviderEvent,
) -> tracing::Span {
    match Plan::of_kind(event.kind).shape {
        Shape::ClaimOnly(_) => db::client_span!(parent: parent, server, RECORD_CLAIM_ONLY_SUMMARY),
        Shape::Apply => db::client_span!(parent: parent, server, RECORD_EVENT_SUMMARY),
        Shape::ApplyStoppingShipment => {
            db::client_span!(parent: parent, server, RECORD_EVENT_STOPPING_SHIPMENT_SUMMARY)
        }
    }
}

/// The client span of [`record_events`] for one delivery of a batch of
/// `size`, to `server`, under the delivery's span `parent`: each delivery's
/// trace shows the statement that recorded it.
pub fn record_batch_span(parent: &tracing::Span, server: &db::span::Server, size: usize) -> tracing::Span {
    let span = db::client_span!(parent: parent, server, RECORD_EVENTS_BATCH_SUMMARY);
    span.record("db.operation.batch.size", i64::try_from(size).unwrap_or(i64::MAX));
    span
}

/// What happened to one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The stored result: the response body of every delivery of this id.
    pub body: String,
    pub delivery: Delivery,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The first delivery of this id: the event was applied with this
    /// outcome, and `enqueued` commands were written to the outbox.
    First { outcome: EventOutcome, enqueued: i32 },
    /// A later delivery of an id already claimed: nothing changed but its
    /// count, and it is answered with the stored result.
    Replay,
}

impl Recorded {
    /// Commands this delivery enqueued (none on a replay).
    pub fn enqueued(&self) -> i32 {
        match self.delivery {
            Delivery::First { enqueued, .. } => enqueued,
            Delivery::Replay => 0,
        }
    }

    fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error> {
        let delivery = if row.try_get("claimed")? {
            Delivery::First {
                // Decoded only here: a replay's stored status is never read,
                // so one written by a newer version still replays.
                outcome: row.try_get::<_, StoredOutcome>("status")?.0,
                enqueued: row.try_get("enqueued")?,
            }
        } else {
            Delivery::Replay
        };
        Ok(Self {
            body: row.try_get("body")?,
            delivery,
        })
    }
}

/// Claims and applies one verified event; see the module documentation.
/// One round trip in either pool mode (see [`db::sql`]).
pub async fn record_event(
    client: &db::Client,
    event: &ProviderEvent,
    raw_body: &str,
    trace_context: Option<&str>,
) -> Result<Recorded, tokio_postgres::Error> {
    let plan = Plan::of_kind(event.kind);
    let row = match plan.shape {
        Shape::ClaimOnly(outcome) => {
            RECORD_CLAIM_ONLY
                .query_one(
                    client,
                    &[
                        &event.id,
                        &event.event_type,
                        &outcome.as_str(),
                        &raw_body,
                        &trace_context,
                    ],
                )
                .await?
        }
        Shape::Apply => {
            RECORD_EVENT
                .query_one(
                    client,
                    &[
                        &event.id,
                        &event.event_type,
                        &event.payment_id,
                        &plan.json,
                        &raw_body,
                        &trace_context,
                        &PAYLOAD_VERSION,
                    ],
                )
                .await?
        }
        Shape::ApplyStoppingShipment => {
            RECORD_EVENT_STOPPING_SHIPMENT
                .query_one(
                    client,
                    &[
                        &event.id,
                        &event.event_type,
                        &event.payment_id,
                        &plan.json,
                        &raw_body,
                        &trace_context,
                        &PAYLOAD_VERSION,
                    ],
                )
                .await?
        }
    };
    Recorded::from_row(&row)
}

/// One delivery of a batch: the verified event, its body as delivered and
/// its request's `traceparent`.
pub struct Pending<'a> {
    pub event: &'a ProviderEvent,
    pub raw_body: &'a str,
    pub trace_context: &'a str,
}

/// Whether an event may be recorded in a batch: the kinds whose statement is
/// `record_event.sql` (payments). Refunds and ignored types are rare, and
/// keep their own statements.
pub fn batchable(event: &ProviderEvent) -> bool {
    Plan::of_kind(event.kind).shape == Shape::Apply
}

/// Claims and applies several [`batchable`] events in one statement, one
/// transaction. The batch must hold no two events of one id or of one
/// payment id. Each event gets its own answer, in the batch's order; `None`
/// for one that was left alone because another transaction held its order
/// locked (the batch waits for no order): nothing of it was written, and it
/// is recorded on its own by [`record_event`].
pub async fn record_events(
    client: &db::Client,
    batch: &[Pending<'_>],
) -> Result<Vec<Option<Recorded>>, tokio_postgres::Error> {
    let ids: Vec<&str> = batch.iter().map(|p| p.event.id.as_str()).collect();
    let types: Vec<&str> = batch.iter().map(|p| p.event.event_type.as_str()).collect();
    let payments: Vec<Option<&str>> = batch.iter().map(|p| p.event.payment_id.as_deref()).collect();
    let plans: Vec<&str> = batch
        .iter()
        .map(|p| Plan::of_kind(p.event.kind).json.as_str())
        .collect();
    let bodies: Vec<&str> = batch.iter().map(|p| p.raw_body).collect();
    let traces: Vec<&str> = batch.iter().map(|p| p.trace_context).collect();
    let rows = RECORD_EVENTS_BATCH
        .query(
            client,
            &[
                &ids,
                &types,
                &payments,
                &plans,
                &bodies,
                &traces,
                &PAYLOAD_VERSION,
            ],
        )
        .await?;
    let mut answers: Vec<Option<Recorded>> = vec![None; batch.len()];
    for row in &rows {
        let n: i32 = row.try_get("n")?;
        let slot = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| answers.get_mut(i));
        if let Some(slot) = slot {
            *slot = Some(Recorded::from_row(row)?);
        }
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::plan::NO_ORDER;

    #[test]
    fn each_statement_has_a_span_summary_of_what_it_does() {
        for (summary, sql) in [
            (RECORD_EVENT_SUMMARY, &RECORD_EVENT),
            (
                RECORD_EVENT_STOPPING_SHIPMENT_SUMMARY,
                &RECORD_EVENT_STOPPING_SHIPMENT,
            ),
            (RECORD_CLAIM_ONLY_SUMMARY, &RECORD_CLAIM_ONLY),
            (RECORD_EVENTS_BATCH_SUMMARY, &RECORD_EVENTS_BATCH),
        ] {
            assert_eq!(summary.describes(sql), Ok(()));
        }
    }

    #[test]
    fn only_the_refunds_statement_stops_a_shipment() {
        assert!(!RECORD_EVENT.text.contains("stopped AS"));
        assert!(RECORD_EVENT_STOPPING_SHIPMENT.text.contains("stopped AS"));
    }

    #[test]
    fn the_statements_look_the_plan_up_by_the_plans_own_keys() {
        for sql in [&RECORD_EVENT, &RECORD_EVENT_STOPPING_SHIPMENT] {
            assert!(
                sql.text
                    .contains(&format!("coalesce(order_locked.status, '{NO_ORDER}')")),
                "{}",
                sql.name
            );
        }
    }

    /// The two shapes are one statement: the refund's is the payment's with
    /// its `stopped` step added, nothing else changed; and the replay applies
    /// an event with the same steps (build.rs).
    #[test]
    fn the_two_shapes_differ_only_by_the_shipments_step() {
        let refund = RECORD_EVENT_STOPPING_SHIPMENT.text;
        let stopped = refund
            .find("), stopped AS (")
            .zip(refund.find("), enqueued AS ("))
            .map(|(start, end)| &refund[start..end])
            .expect("a stopped step before the enqueue");
        assert_eq!(refund.replacen(stopped, "", 1), RECORD_EVENT.text);
        let replay = crate::storage::story::REPLAY_EVENT.text;
        let steps = &refund[refund.find("), order_update AS (").expect("the order's step")..];
        let steps = &steps[..steps.find("\n)\nSELECT").expect("the answer")];
        assert!(replay.contains(steps), "{replay}");
        let included = |text: &str| text.lines().all(|l| !l.starts_with("-- include"));
        assert!(included(refund) && included(replay));
    }
}
