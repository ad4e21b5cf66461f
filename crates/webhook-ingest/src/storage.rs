//! All of the ingest's SQL.
//!
//! [`record_event`] is the product's core: ONE statement, so ONE round trip
//! and ONE transaction (autocommit), that
//! 1. locks the event's order, if any (`FOR UPDATE`: concurrent events for one
//!    order serialise here, so each sees the state the previous one left);
//! 2. claims the event id by inserting it (`ON CONFLICT` on the primary key: an
//!    atomic test-and-set, no read-then-write); a conflict instead counts the
//!    delivery and returns the stored result for a byte-identical replay;
//! 3. only when claimed: changes the order, cancels its unsent shipment (on a
//!    refund) and inserts the outbox rows, all of which become visible when,
//!    and only when, the claim commits.
//!
//! The relays are woken by [`wake_relays`] just after the commit, not by a
//! `NOTIFY` inside the transaction: Postgres serialises every notifying
//! transaction through its commit on one global lock, WAL flush included, so
//! a `NOTIFY` per event caps the ingest at one flush at a time (measured here:
//! the reference one-statement ingest fell from 4,100-4,700 to 280-820
//! transactions/s at 64 clients with a `pg_notify` added). See
//! [`crate::notifier`].
//!
//! The business rule is not in this SQL: [`domain::transition`] is evaluated
//! for each possible order state up front and passed in as arrays indexed by
//! state; the statement picks the entry for the state it finds under lock.

use db::{Executor, Sql};
use domain::{CommandKind, EventKind, OrderStatus, PAYLOAD_VERSION, ProviderEvent, transition};
use tokio_postgres::types::Type;

/// The channel the relay `LISTEN`s on.
pub const NOTIFY_CHANNEL: &str = "outbox_pending";

/// Order states as the statement indexes them (1-based SQL arrays).
const STATES: [Option<OrderStatus>; 4] = [
    None,
    Some(OrderStatus::Pending),
    Some(OrderStatus::Paid),
    Some(OrderStatus::Refunded),
];

/// The claim-and-apply statement, with optional extra CTEs (the refund's
/// cancellation) before the outbox insert. One text per shape, so each
/// prepared statement carries only the steps its events can take: executor
/// start-up is a large share of the database's work per webhook, and it grows
/// with every node in the plan.
macro_rules! record_event {
    ($($extra:literal)?) => {
        concat!(
            r#"
WITH ord AS (
    SELECT id, status FROM orders WHERE payment_id = $3 FOR UPDATE
), st AS (
    SELECT ord.id AS order_id,
           CASE ord.status WHEN 'pending' THEN 2 WHEN 'paid' THEN 3 WHEN 'refunded' THEN 4 ELSE 1 END AS s
    FROM (SELECT) AS one LEFT JOIN ord ON true
), claim AS (
    INSERT INTO processed_events AS pe (event_id, event_type, status, order_id, result, payload, trace_context)
    SELECT $1, $2, ($4::text[])[st.s], st.order_id,
           jsonb_strip_nulls(jsonb_build_object(
               'event_id', $1::text, 'status', ($4::text[])[st.s], 'order_id', st.order_id)),
           $8::text::jsonb, $9
    FROM st
    ON CONFLICT (event_id) DO UPDATE
        SET deliveries = pe.deliveries + 1, last_delivered_at = now()
    RETURNING (pe.xmax = 0) AS claimed, pe.result::text AS body, pe.status
), order_update AS (
    UPDATE orders SET status = ($5::text[])[st.s], updated_at = now()
    FROM st, claim
    WHERE claim.claimed AND orders.id = st.order_id AND ($5::text[])[st.s] IS NOT NULL
)"#,
            $($extra,)?
            r#", enqueued AS (
    INSERT INTO outbox (kind, payload, idempotency_key, event_id, order_id, trace_context)
    SELECT k.kind,
           jsonb_build_object('v', $10::int4, 'order_id', st.order_id, 'event_id', $1::text),
           k.prefix || '-' || st.order_id, $1, st.order_id, $9
    FROM st, claim, unnest($11::text[], $12::text[]) WITH ORDINALITY AS k(kind, prefix, n)
    WHERE claim.claimed AND st.order_id IS NOT NULL
      AND (($6::int4[])[st.s] >> (k.n - 1)::int4) & 1 = 1
    ORDER BY k.n
    -- One effect per order and kind, whatever the number of events.
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING 1
)
SELECT claim.claimed, claim.body, claim.status, (SELECT count(*) FROM enqueued)::int4
FROM claim
"#
        )
    };
}

const RECORD_TYPES: &[Type] = &[
    Type::TEXT,       // $1 event id
    Type::TEXT,       // $2 event type
    Type::TEXT,       // $3 payment id
    Type::TEXT_ARRAY, // $4 outcome per state
    Type::TEXT_ARRAY, // $5 new order status per state
    Type::INT4_ARRAY, // $6 enqueue mask per state
    Type::BOOL_ARRAY, // $7 cancel the unsent shipment, per state
    Type::TEXT,       // $8 the raw body (stored as jsonb)
    Type::TEXT,       // $9 traceparent
    Type::INT4,       // $10 payload version
    Type::TEXT_ARRAY, // $11 command kinds
    Type::TEXT_ARRAY, // $12 their key prefixes
    Type::TEXT,       // $13 the shipment's key prefix
    Type::TEXT,       // $14 the shipment's kind
];

/// Events that change orders and enqueue commands (payments).
const RECORD_EVENT: Sql = Sql::new("record_event", record_event!(), RECORD_TYPES);

/// The same, for events that may also stop the order's shipment (refunds).
const RECORD_EVENT_CANCELLING: Sql = Sql::new("record_event_cancelling", 
    record_event!(
        r#", stopped AS (
    -- The order's shipment, stopped. An upsert on its unique key, not an
    -- UPDATE of a row found by a look-up: this statement's snapshot was taken
    -- before it waited for the order's lock, so a look-up misses the shipment
    -- that a payment holding the lock just committed. ON CONFLICT finds and
    -- locks the latest committed row whatever the snapshot. A row not yet
    -- sent (or dead) is cancelled; a row whose call is under way keeps its
    -- lease, so its holder may still record `done` for THAT call and nothing
    -- else (crates/outbox-relay/src/storage.rs); a done row stays done. With
    -- no row at all (retention removed it long after it was done), the
    -- proposed row is written, cancelled, saying why.
    INSERT INTO outbox AS o (kind, payload, idempotency_key, event_id, order_id, trace_context,
                             status, finished_at, last_error)
    SELECT $14, jsonb_build_object('v', $10::int4, 'order_id', st.order_id, 'event_id', $1::text),
           $13 || '-' || st.order_id, $1, st.order_id, $9,
           'cancelled', now(), 'no shipment to stop: retention had removed it; refund ' || $1
    FROM st, claim
    WHERE claim.claimed AND ($7::bool[])[st.s]
    ON CONFLICT (idempotency_key) DO UPDATE
        SET status = 'cancelled', finished_at = now(), last_error = 'cancelled by ' || $1
        WHERE o.status IN ('pending', 'dead')
)"#
    ),
    RECORD_TYPES,
);

/// Events whose outcome does not depend on any order and that change
/// nothing (types we ignore): the claim alone.
const RECORD_CLAIM_ONLY: Sql = Sql::new("record_claim_only", 
    r#"
INSERT INTO processed_events AS pe (event_id, event_type, status, result, payload, trace_context)
VALUES ($1, $2, $3, jsonb_build_object('event_id', $1::text, 'status', $3::text), $4::text::jsonb, $5)
ON CONFLICT (event_id) DO UPDATE
    SET deliveries = pe.deliveries + 1, last_delivered_at = now()
RETURNING (pe.xmax = 0) AS claimed, pe.result::text AS body, pe.status, 0::int4
"#,
    &[
        Type::TEXT, // $1 event id
        Type::TEXT, // $2 event type
        Type::TEXT, // $3 outcome
        Type::TEXT, // $4 the raw body (stored as jsonb)
        Type::TEXT, // $5 traceparent
    ],
);

/// What happened to one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// False for a duplicate delivery: nothing changed but its count.
    pub claimed: bool,
    /// The stored result, the response body of every delivery of this id.
    pub body: String,
    /// The event's recorded `status` (an [`domain::Outcome`] name).
    pub status: String,
    pub enqueued: i32,
}

/// The per-state arrays the statement picks from.
struct Plan {
    outcomes: Vec<&'static str>,
    new_status: Vec<Option<&'static str>>,
    enqueue_mask: Vec<i32>,
    /// `CommandKind::ALL` as names and key prefixes (bit `i` of a mask is `kinds[i]`).
    kinds: Vec<&'static str>,
    prefixes: Vec<&'static str>,
    cancel: Vec<bool>,
}

impl Plan {
    /// The outcome, when it is the same whatever the order's state and the
    /// event changes nothing: then the order need not even be looked up.
    fn claim_only(&self) -> Option<&'static str> {
        let first = self.outcomes[0];
        let uniform = self.outcomes.iter().all(|o| *o == first);
        let inert = self.new_status.iter().all(Option::is_none)
            && self.enqueue_mask.iter().all(|m| *m == 0)
            && !self.cancels();
        (uniform && inert).then_some(first)
    }

    fn cancels(&self) -> bool {
        self.cancel.iter().any(|c| *c)
    }
}

/// The plan of each event kind, computed once.
fn plan_for(kind: EventKind) -> &'static Plan {
    static PLANS: std::sync::LazyLock<[Plan; 3]> = std::sync::LazyLock::new(|| {
        [
            plan(EventKind::PaymentSucceeded),
            plan(EventKind::PaymentRefunded),
            plan(EventKind::Other),
        ]
    });
    match kind {
        EventKind::PaymentSucceeded => &PLANS[0],
        EventKind::PaymentRefunded => &PLANS[1],
        EventKind::Other => &PLANS[2],
    }
}

fn plan(kind: EventKind) -> Plan {
    let mut plan = Plan {
        outcomes: Vec::with_capacity(4),
        new_status: Vec::with_capacity(4),
        enqueue_mask: Vec::with_capacity(4),
        cancel: Vec::with_capacity(4),
        kinds: CommandKind::ALL.iter().map(|k| k.as_str()).collect(),
        prefixes: CommandKind::ALL.iter().map(|k| k.key_prefix()).collect(),
    };
    for state in STATES {
        let t = transition(kind, state);
        plan.outcomes.push(t.outcome.as_str());
        plan.new_status.push(t.set_status.map(OrderStatus::as_str));
        plan.enqueue_mask
            .push(t.enqueue.iter().fold(0, |mask, k| mask | kind_bit(*k)));
        plan.cancel.push(t.cancel_pending_shipments);
    }
    plan
}

/// Bit of a command kind in the enqueue mask: its position in `CommandKind::ALL`.
fn kind_bit(kind: CommandKind) -> i32 {
    let position = CommandKind::ALL
        .iter()
        .position(|k| *k == kind)
        .expect("ALL lists every kind");
    1 << position
}

/// Claims and applies one verified event; see the module documentation.
/// One round trip in either pool mode (see [`db::sql`]).
pub async fn record_event(
    client: &db::Client,
    event: &ProviderEvent,
    raw_body: &str,
    trace_context: Option<&str>,
) -> Result<Recorded, tokio_postgres::Error> {
    let plan = plan_for(event.kind);
    let row = if let Some(outcome) = plan.claim_only() {
        RECORD_CLAIM_ONLY
            .query_one(
                client,
                &[&event.id, &event.event_type, &outcome, &raw_body, &trace_context],
            )
            .await?
    } else {
        let statement = if plan.cancels() {
            &RECORD_EVENT_CANCELLING
        } else {
            &RECORD_EVENT
        };
        statement
            .query_one(
                client,
                &[
                    &event.id,
                    &event.event_type,
                    &event.payment_id,
                    &plan.outcomes,
                    &plan.new_status,
                    &plan.enqueue_mask,
                    &plan.cancel,
                    &raw_body,
                    &trace_context,
                    &PAYLOAD_VERSION,
                    &plan.kinds,
                    &plan.prefixes,
                    &CommandKind::ShipOrder.key_prefix(),
                    &CommandKind::ShipOrder.as_str(),
                ],
            )
            .await?
    };
    Ok(Recorded {
        claimed: row.get(0),
        body: row.get(1),
        status: row.get(2),
        enqueued: row.get(3),
    })
}

/// Wakes the relays: a `NOTIFY` in a transaction of its own, committed
/// without waiting for the WAL flush (a lost notification costs a poll
/// interval, nothing else: the rows are durable already).
const WAKE_RELAYS: Sql = Sql::new("wake_relays", 
    "SELECT set_config('synchronous_commit', 'off', true), pg_notify('outbox_pending', '')",
    &[],
);

pub async fn wake_relays(client: &impl Executor) -> Result<(), tokio_postgres::Error> {
    WAKE_RELAYS.execute(client, &[]).await.map(|_| ())
}

/// One recorded event, as `events list` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EventRow {
    pub event_id: String,
    pub event_type: String,
    pub status: String,
    #[serde(with = "time::serde::rfc3339")]
    pub processed_at: time::OffsetDateTime,
    pub deliveries: i32,
    pub order_id: Option<i64>,
    pub payload: Option<serde_json::Value>,
}

const LIST_EVENTS: Sql = Sql::new("list_events", 
    "SELECT event_id, event_type, status, processed_at, deliveries, order_id, payload
       FROM processed_events
      WHERE $1::text IS NULL OR status = $1
      ORDER BY processed_at DESC, event_id
      LIMIT $2",
    &[Type::TEXT, Type::INT8],
);

/// Recorded events, newest first, optionally of one status.
pub async fn list_events(
    client: &(impl Executor + ?Sized),
    status: Option<&str>,
    limit: i64,
) -> Result<Vec<EventRow>, tokio_postgres::Error> {
    let rows = LIST_EVENTS.query(client, &[&status, &limit]).await?;
    Ok(rows
        .into_iter()
        .map(|r| EventRow {
            event_id: r.get(0),
            event_type: r.get(1),
            status: r.get(2),
            processed_at: r.get(3),
            deliveries: r.get(4),
            order_id: r.get(5),
            payload: r.get(6),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_follows_the_domain_table() {
        let p = plan(EventKind::PaymentSucceeded);
        assert_eq!(
            p.outcomes,
            ["unmatched", "processed", "already_paid", "order_refunded"]
        );
        assert_eq!(p.new_status, [None, Some("paid"), None, None]);
        assert_eq!(p.enqueue_mask, [0, 0b011, 0, 0]);
        assert_eq!(p.cancel, [false; 4]);
        let p = plan(EventKind::PaymentRefunded);
        assert_eq!(p.outcomes, ["unmatched", "refunded", "refunded", "refunded"]);
        // A refund of a refunded order changes nothing: one notice per order, ever.
        assert_eq!(p.new_status, [None, Some("refunded"), Some("refunded"), None]);
        assert_eq!(p.enqueue_mask, [0, 0b100, 0b100, 0]);
        // Only a paid order has a shipment to stop.
        assert_eq!(p.cancel, [false, false, true, false]);
        let p = plan(EventKind::Other);
        assert_eq!(p.outcomes, ["ignored"; 4]);
        assert_eq!(p.enqueue_mask, [0; 4]);
    }

    #[test]
    fn each_kind_gets_the_smallest_statement_that_does_its_work() {
        assert_eq!(plan_for(EventKind::Other).claim_only(), Some("ignored"));
        assert_eq!(plan_for(EventKind::PaymentSucceeded).claim_only(), None);
        assert!(!plan_for(EventKind::PaymentSucceeded).cancels());
        assert_eq!(plan_for(EventKind::PaymentRefunded).claim_only(), None);
        assert!(plan_for(EventKind::PaymentRefunded).cancels());
        assert!(!RECORD_EVENT.text.contains("stopped AS"));
        assert!(RECORD_EVENT_CANCELLING.text.contains("stopped AS"));
    }

    #[test]
    fn the_relays_are_woken_on_their_channel_outside_the_claim() {
        assert!(
            WAKE_RELAYS
                .text
                .contains(&format!("pg_notify('{NOTIFY_CHANNEL}'"))
        );
        for sql in [&RECORD_EVENT, &RECORD_EVENT_CANCELLING, &RECORD_CLAIM_ONLY] {
            assert!(
                !sql.text.contains("pg_notify"),
                "a NOTIFY in the claim serialises commits"
            );
        }
    }

    #[test]
    fn every_statement_declares_a_type_per_parameter() {
        for sql in [
            &RECORD_EVENT_CANCELLING,
            &RECORD_CLAIM_ONLY,
            &LIST_EVENTS,
            &WAKE_RELAYS,
        ] {
            assert_eq!(sql.placeholders(), sql.types.len(), "{}", sql.text);
        }
        // Shares its sibling's parameters; only the shipment's key prefix
        // and kind ($13 and $14, for stopping it) go unused.
        assert_eq!(RECORD_EVENT.placeholders(), RECORD_TYPES.len() - 2);
    }
}
