//! Orders and what each event does to them.
//!
//! [`transition`] is the whole business rule of the ingest as a table over
//! (event kind, order state). The ingest evaluates it for every possible order
//! state up front and lets one SQL statement pick the row matching the state it
//! finds under lock, so the rule lives here while the database does one round
//! trip.

use crate::command::CommandKind;
use crate::event::EventKind;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderStatus {
    Pending,
    Paid,
    Refunded,
}

impl OrderStatus {
    pub const ALL: [OrderStatus; 3] = [Self::Pending, Self::Paid, Self::Refunded];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Paid => "paid",
            Self::Refunded => "refunded",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

/// What became of a processed event: its `status` in `processed_events` and
/// in the response the provider reads, and what `events list --status`
/// filters on. Written by its [`as_str`](Self::as_str) name (also its JSON
/// form), which never changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventOutcome {
    /// A payment for a pending order: paid, shipment and confirmation enqueued.
    Processed,
    /// An event type we do not act on; recorded so a retry replays.
    Ignored,
    /// No order has this payment id; recorded with its payload to reconcile.
    Unmatched,
    /// A second, distinct payment event for an order already paid.
    AlreadyPaid,
    /// A refund: order refunded; the first refund of an order also enqueues
    /// its refund notice and stops its shipment.
    Refunded,
    /// A payment for an order already refunded (events out of order): nothing shipped.
    OrderRefunded,
    /// An `unmatched` event an operator decided will never match, with a
    /// reason (`webhook-ingest events discard`). Never an answer: the event
    /// keeps the answer it was given, and no rule produces this outcome.
    Discarded,
}

impl EventOutcome {
    /// Every outcome an answer's `status` can carry.
    pub const ANSWERS: [EventOutcome; 6] = [
        Self::Processed,
        Self::Ignored,
        Self::Unmatched,
        Self::AlreadyPaid,
        Self::Refunded,
        Self::OrderRefunded,
    ];

    /// Every status a recorded event can have: the answers, and `discarded`.
    pub const ALL: [EventOutcome; 7] = [
        Self::Processed,
        Self::Ignored,
        Self::Unmatched,
        Self::AlreadyPaid,
        Self::Refunded,
        Self::OrderRefunded,
        Self::Discarded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processed => "processed",
            Self::Ignored => "ignored",
            Self::Unmatched => "unmatched",
            Self::AlreadyPaid => "already_paid",
            Self::Refunded => "refunded",
            Self::OrderRefunded => "order_refunded",
            Self::Discarded => "discarded",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == s)
    }
}

impl std::fmt::Display for EventOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl serde::Serialize for EventOutcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// What one event does to one order in one state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub outcome: EventOutcome,
    /// The order's new status, if it changes.
    pub set_status: Option<OrderStatus>,
    /// Commands to enqueue for the order, in this order.
    pub enqueue: &'static [CommandKind],
    /// Stop the order's `ShipOrder`: a row not yet sent is cancelled; a row
    /// whose call is under way (claimed by a relay) ends `done` only if that
    /// very call succeeds, and is never called again.
    pub cancel_pending_shipments: bool,
}

const NOTHING: &[CommandKind] = &[];

impl Transition {
    const fn record(outcome: EventOutcome) -> Self {
        Self {
            outcome,
            set_status: None,
            enqueue: NOTHING,
            cancel_pending_shipments: false,
        }
    }
}

/// The rule: what `kind` does to an order found in state `order` (`None`: no
/// order has the event's payment id).
pub fn transition(kind: EventKind, order: Option<OrderStatus>) -> Transition {
    use OrderStatus::*;
    match (kind, order) {
        (EventKind::Other, _) => Transition::record(EventOutcome::Ignored),
        (_, None) => Transition::record(EventOutcome::Unmatched),
        (EventKind::PaymentSucceeded, Some(Pending)) => Transition {
            outcome: EventOutcome::Processed,
            set_status: Some(Paid),
            enqueue: &[CommandKind::ShipOrder, CommandKind::SendConfirmation],
            cancel_pending_shipments: false,
        },
        (EventKind::PaymentSucceeded, Some(Paid)) => Transition::record(EventOutcome::AlreadyPaid),
        (EventKind::PaymentSucceeded, Some(Refunded)) => Transition::record(EventOutcome::OrderRefunded),
        // A refund wins whatever the order's state, including one that was
        // never paid (the refund overtook the payment): the order is refunded
        // and gets its one refund notice. Only a paid order can have a
        // shipment to stop.
        (EventKind::PaymentRefunded, Some(state @ (Pending | Paid))) => Transition {
            outcome: EventOutcome::Refunded,
            set_status: Some(Refunded),
            enqueue: &[CommandKind::SendRefundNotice],
            cancel_pending_shipments: state == Paid,
        },
        // A second, distinct refund of a refunded order: recorded, nothing
        // else. The order's status is the memory of "at most one notice per
        // order, ever": it outlives the retention that deletes the first
        // notice's outbox row and the first refund's event.
        (EventKind::PaymentRefunded, Some(Refunded)) => Transition::record(EventOutcome::Refunded),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [EventKind; 3] = [
        EventKind::PaymentSucceeded,
        EventKind::PaymentRefunded,
        EventKind::Other,
    ];

    fn states() -> impl Iterator<Item = Option<OrderStatus>> {
        std::iter::once(None).chain(OrderStatus::ALL.into_iter().map(Some))
    }

    #[test]
    fn the_whole_table() {
        use CommandKind::*;
        use EventKind::*;
        use OrderStatus::*;
        let expect = |kind, state, outcome, set: Option<OrderStatus>, enqueue: &[CommandKind], cancel| {
            let t = transition(kind, state);
            assert_eq!(t.outcome, outcome, "{kind:?} {state:?}");
            assert_eq!(t.set_status, set, "{kind:?} {state:?}");
            assert_eq!(t.enqueue, enqueue, "{kind:?} {state:?}");
            assert_eq!(t.cancel_pending_shipments, cancel, "{kind:?} {state:?}");
        };
        expect(PaymentSucceeded, None, EventOutcome::Unmatched, None, &[], false);
        expect(
            PaymentSucceeded,
            Some(Pending),
            EventOutcome::Processed,
            Some(Paid),
            &[ShipOrder, SendConfirmation],
            false,
        );
        expect(
            PaymentSucceeded,
            Some(Paid),
            EventOutcome::AlreadyPaid,
            None,
            &[],
            false,
        );
        expect(
            PaymentSucceeded,
            Some(Refunded),
            EventOutcome::OrderRefunded,
            None,
            &[],
            false,
        );
        expect(PaymentRefunded, None, EventOutcome::Unmatched, None, &[], false);
        expect(
            PaymentRefunded,
            Some(Pending),
            EventOutcome::Refunded,
            Some(Refunded),
            &[SendRefundNotice],
            false,
        );
        expect(
            PaymentRefunded,
            Some(Paid),
            EventOutcome::Refunded,
            Some(Refunded),
            &[SendRefundNotice],
            true,
        );
        expect(
            PaymentRefunded,
            Some(Refunded),
            EventOutcome::Refunded,
            None,
            &[],
            false,
        );
        for state in states() {
            expect(Other, state, EventOutcome::Ignored, None, &[], false);
        }
    }

    #[test]
    fn no_state_ships_twice_or_ships_a_refunded_order() {
        for kind in KINDS {
            for state in [Some(OrderStatus::Paid), Some(OrderStatus::Refunded)] {
                assert!(!transition(kind, state).enqueue.contains(&CommandKind::ShipOrder));
            }
        }
    }

    /// Whatever the events and their order, an order gets at most one
    /// shipment, one confirmation and one refund notice, and is never shipped
    /// once refunded: every command is enqueued on leaving a state that can
    /// never be re-entered.
    #[test]
    fn no_sequence_of_events_enqueues_a_command_twice() {
        fn walk(state: OrderStatus, seen: &[CommandKind], depth: usize) {
            if depth == 0 {
                return;
            }
            for kind in KINDS {
                let t = transition(kind, Some(state));
                let mut seen = seen.to_vec();
                for command in t.enqueue {
                    assert!(
                        !seen.contains(command),
                        "{command:?} twice via {kind:?} in {state:?}"
                    );
                    seen.push(*command);
                }
                if state == OrderStatus::Refunded {
                    assert!(!t.enqueue.contains(&CommandKind::ShipOrder));
                }
                walk(t.set_status.unwrap_or(state), &seen, depth - 1);
            }
        }
        walk(OrderStatus::Pending, &[], 6);
    }

    #[test]
    fn only_a_refund_cancels_and_it_never_ships() {
        for kind in KINDS {
            for state in states() {
                let t = transition(kind, state);
                if t.cancel_pending_shipments {
                    assert_eq!(kind, EventKind::PaymentRefunded);
                    assert!(!t.enqueue.contains(&CommandKind::ShipOrder));
                }
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for s in OrderStatus::ALL {
            assert_eq!(OrderStatus::parse(s.as_str()), Some(s));
        }
        for o in EventOutcome::ALL {
            assert_eq!(EventOutcome::parse(o.as_str()), Some(o));
        }
        assert_eq!(OrderStatus::parse("shipped"), None);
        assert_eq!(EventOutcome::parse("duplicate"), None);
        assert_eq!(
            serde_json::to_string(&EventOutcome::AlreadyPaid).unwrap(),
            r#""already_paid""#
        );
        assert_eq!(EventOutcome::OrderRefunded.to_string(), "order_refunded");
        assert_eq!(format!("{:<10}|", EventOutcome::Ignored), "ignored   |");
    }
}
