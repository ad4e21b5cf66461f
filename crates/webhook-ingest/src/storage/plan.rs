//! The plan: what an event of one kind does to its order, for each state the
//! order may be in, as the record statement reads it.
//!
//! [`domain::transition`] decides; the statement only looks the decision up.
//! The plan is a JSON object keyed by the order's state (its
//! [`OrderStatus::as_str`] name, or [`NO_ORDER`]), computed once per event
//! kind and passed as the statement's `plan` parameter; the statement locks
//! the order, reads its status and takes the entry of that name:
//!
//! ```text
//! {"no_order": {"outcome": "unmatched"},
//!  "pending":  {"outcome": "processed", "set_status": "paid",
//!               "enqueue": [{"kind": "ship_order", "key_prefix": "ship"},
//!                           {"kind": "send_confirmation", "key_prefix": "conf"}]},
//!  "paid":     {"outcome": "already_paid"},
//!  "refunded": {"outcome": "order_refunded"}}
//! ```
//!
//! What an entry leaves out is the default (no new status, nothing to
//! enqueue, no shipment to stop): the server parses the plan on every call,
//! so it is kept short.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use domain::{CommandKind, EventKind, EventOutcome, OrderStatus, Transition, transition};
use serde::Serialize;

/// The plan's key for an event whose payment id no order has. The record
/// statements name it too (`coalesce(order_locked.status, 'no_order')`).
pub(super) const NO_ORDER: &str = "no_order";

/// The key of the plan's entry for an order found in `state`.
fn key(state: Option<OrderStatus>) -> &'static str {
    state.map_or(NO_ORDER, OrderStatus::as_str)
}

/// Every state an event may find its order in, `None` for no order.
fn states() -> impl Iterator<Item = Option<OrderStatus>> {
    std::iter::once(None).chain(OrderStatus::ALL.into_iter().map(Some))
}

/// One entry of the plan: a [`Transition`] in the statement's words.
#[derive(Debug, Serialize, PartialEq, Eq)]
struct Step {
    outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    set_status: Option<&'static str>,
    /// The commands to enqueue, in this order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    enqueue: Vec<CommandSpec>,
    /// The order's shipment, to stop (`steps/stop_shipment.sql`).
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_shipment: Option<CommandSpec>,
}

/// A command as the statement writes its row: its kind and the prefix of
/// its idempotency key (the statement appends the order's id, as
/// [`domain::CommandKind::idempotency_key`]).
#[derive(Debug, Serialize, PartialEq, Eq)]
struct CommandSpec {
    kind: &'static str,
    key_prefix: &'static str,
}

impl From<CommandKind> for CommandSpec {
    fn from(kind: CommandKind) -> Self {
        Self {
            kind: kind.as_str(),
            key_prefix: kind.key_prefix(),
        }
    }
}

impl From<Transition> for Step {
    fn from(t: Transition) -> Self {
        Self {
            outcome: t.outcome.as_str(),
            set_status: t.set_status.map(OrderStatus::as_str),
            enqueue: t.enqueue.iter().copied().map(CommandSpec::from).collect(),
            stop_shipment: t
                .cancel_pending_shipments
                .then(|| CommandSpec::from(CommandKind::ShipOrder)),
        }
    }
}

/// Which statement an event kind needs: the smallest that does its work.
/// Executor start-up is a large share of the database's work per webhook, and
/// it grows with every node in the plan, so each statement carries only the
/// steps its events can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// The outcome is this one whatever the order's state, and the event
    /// changes nothing: the claim alone (`record_claim_only.sql`).
    ClaimOnly(EventOutcome),
    /// Claim, change the order, enqueue (`record_event.sql`).
    Apply,
    /// The same, and stop the order's shipment (`record_event.sql` with its
    /// `(refunds)` step).
    ApplyStoppingShipment,
}

/// What an event kind does, computed once.
#[derive(Debug)]
pub(super) struct Plan {
    pub shape: Shape,
    /// The record statement's `plan` parameter.
    pub json: String,
}

impl Plan {
    fn of(kind: EventKind) -> Self {
        let transitions: Vec<(Option<OrderStatus>, Transition)> =
            states().map(|state| (state, transition(kind, state))).collect();
        let first = transitions[0].1.outcome;
        let changes_nothing = |t: &Transition| {
            t.outcome == first
                && t.set_status.is_none()
                && t.enqueue.is_empty()
                && !t.cancel_pending_shipments
        };
        let shape = if transitions.iter().all(|(_, t)| changes_nothing(t)) {
            Shape::ClaimOnly(first)
        } else if transitions.iter().any(|(_, t)| t.cancel_pending_shipments) {
            Shape::ApplyStoppingShipment
        } else {
            Shape::Apply
        };
        let steps: BTreeMap<&str, Step> = transitions
            .into_iter()
            .map(|(state, t)| (key(state), Step::from(t)))
            .collect();
        let json = serde_json::to_string(&steps).expect("a map of strings serialises");
        Self { shape, json }
    }

    /// The plan of each event kind.
    pub fn of_kind(kind: EventKind) -> &'static Plan {
        static PLANS: LazyLock<[Plan; 3]> = LazyLock::new(|| {
            [
                Plan::of(EventKind::PaymentSucceeded),
                Plan::of(EventKind::PaymentRefunded),
                Plan::of(EventKind::Other),
            ]
        });
        match kind {
            EventKind::PaymentSucceeded => &PLANS[0],
            EventKind::PaymentRefunded => &PLANS[1],
            EventKind::Other => &PLANS[2],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(kind: EventKind) -> serde_json::Value {
        serde_json::from_str(&Plan::of_kind(kind).json).unwrap()
    }

    #[test]
    fn the_plan_follows_the_domain_table_keyed_by_state() {
        assert_eq!(
            steps(EventKind::PaymentSucceeded),
            serde_json::json!({
                "no_order": {"outcome": "unmatched"},
                "pending": {"outcome": "processed", "set_status": "paid", "enqueue": [
                    {"kind": "ship_order", "key_prefix": "ship"},
                    {"kind": "send_confirmation", "key_prefix": "conf"},
                ]},
                "paid": {"outcome": "already_paid"},
                "refunded": {"outcome": "order_refunded"},
            })
        );
        assert_eq!(
            steps(EventKind::PaymentRefunded),
            serde_json::json!({
                "no_order": {"outcome": "unmatched"},
                "pending": {"outcome": "refunded", "set_status": "refunded", "enqueue": [
                    {"kind": "send_refund_notice", "key_prefix": "refund"},
                ]},
                // Only a paid order has a shipment to stop.
                "paid": {"outcome": "refunded", "set_status": "refunded", "enqueue": [
                    {"kind": "send_refund_notice", "key_prefix": "refund"},
                ], "stop_shipment": {"kind": "ship_order", "key_prefix": "ship"}},
                // A refund of a refunded order changes nothing: one notice per order, ever.
                "refunded": {"outcome": "refunded"},
            })
        );
    }

    #[test]
    fn every_state_has_an_entry_under_its_own_name() {
        for kind in [
            EventKind::PaymentSucceeded,
            EventKind::PaymentRefunded,
            EventKind::Other,
        ] {
            let steps = steps(kind);
            assert_eq!(steps.as_object().unwrap().len(), 1 + OrderStatus::ALL.len());
            for state in OrderStatus::ALL {
                assert!(steps.get(state.as_str()).is_some(), "{kind:?} {state:?}");
            }
            assert!(steps.get(NO_ORDER).is_some());
        }
    }

    #[test]
    fn each_kind_gets_the_smallest_statement_that_does_its_work() {
        assert_eq!(
            Plan::of_kind(EventKind::Other).shape,
            Shape::ClaimOnly(EventOutcome::Ignored)
        );
        assert_eq!(Plan::of_kind(EventKind::PaymentSucceeded).shape, Shape::Apply);
        assert_eq!(
            Plan::of_kind(EventKind::PaymentRefunded).shape,
            Shape::ApplyStoppingShipment
        );
    }
}
