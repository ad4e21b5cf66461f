//! The checker: every order's final state and its effects at the downstream
//! against `domain::transition` applied to the order's events in the order
//! the database committed them.
//!
//! What it reads, and why each source can be trusted for what it is used for:
//! - the commit order of an order's events: `history_events.seq`, a sequence
//!   value drawn by a trigger on `processed_events` after the claim's
//!   statement holds the order's row lock, which it keeps until its commit;
//!   the next event of that order can only draw after that commit. An event
//!   that arrived before its order is claimed `unmatched` (an `INSERT` entry
//!   with no order) and applied later by the ingest's reconciler (an
//!   `UPDATE` entry, drawn under the order's lock like any claim): the
//!   `UPDATE` is where it stands in the order's commit order;
//! - the claims of each shipment row: `history_outbox`, written by a
//!   trigger on `outbox` with the database's clock at the claim, before its
//!   commit;
//! - when a refund was certainly committed: the first moment the provider
//!   held its `200` (the commit precedes the answer);
//! - the effects: the downstream's own records, per idempotency key and per
//!   call (arrival, end, answer, whether it created the effect).
//!
//! A rule is broken only when the evidence is certain: "claimed after its
//! refund" needs a claim the database clocked after the provider already
//! held the refund's answer. The allowed exception of the guarantee (a
//! shipment whose call was under way when the refund committed, and then
//! succeeded) is exactly what a claim before the refund's commit permits.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use domain::{CommandKind, EventKind, OrderStatus, Transition};
use simulator::downstream::CallRecord;

use self::events::*;
use self::orders::*;

mod events;
mod orders;

/// One claim of an event id (`INSERT`), or the application of one claimed
/// `unmatched` (`UPDATE`), as the trigger recorded it.
#[derive(Debug, Clone)]
pub struct Claim {
    pub seq: i64,
    pub op: String,
    pub event_id: String,
    pub event_type: String,
    pub order_id: Option<i64>,
    pub status: String,
    pub at_us: i64,
    pub phase: u8,
}

/// One write of an outbox row, as the trigger recorded it.
#[derive(Debug, Clone)]
pub struct RowWrite {
    pub seq: i64,
    pub order_id: i64,
    pub kind: String,
    pub op: String,
    pub old_status: Option<String>,
    pub new_status: String,
    pub old_owner: Option<String>,
    pub new_owner: Option<String>,
    /// A new lease was taken: a claim.
    pub claimed: bool,
    pub at_us: i64,
}

/// One delivery attempt the provider made.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub event_id: String,
    pub phase: u8,
    pub sent_us: i64,
    /// When the provider held a 200, if it got one.
    pub acked_us: Option<i64>,
    pub status: u16,
    /// The `status` of the answer's body.
    pub outcome: Option<String>,
}

/// The downstream's records of one key, over both phases.
#[derive(Debug, Clone, Default)]
pub struct KeyRecord {
    pub effects: u64,
    pub calls: Vec<CallRecord>,
}

pub struct Evidence {
    pub claims: Vec<Claim>,
    pub writes: Vec<RowWrite>,
    pub deliveries: Vec<Delivery>,
    pub orders: HashMap<i64, String>,
    /// Final outbox rows: (kind, order) -> status.
    pub rows: HashMap<(String, i64), String>,
    pub keys: HashMap<String, KeyRecord>,
    /// Every event the provider meant to deliver: id -> (type, order it names).
    pub planned: HashMap<String, (String, Option<i64>)>,
    /// Events whose dedup record the prune removed before phase 2.
    pub pruned: HashSet<String>,
    /// Moments (unix us) a relay was killed or Postgres restarted: a relay
    /// may have held a success it never got to record.
    pub disruptions: Vec<i64>,
    /// The relays' HTTP timeout, in us.
    pub http_timeout_us: i64,
    /// The relays' lease, in us: a call is sent at most this long after the
    /// claim it was sent under.
    pub lease_us: i64,
    /// Orders created after their first events were sent: when the
    /// creation committed (unix us).
    pub late_orders: HashMap<i64, i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Violation {
    /// An event's recorded outcome is not what the rule gives in commit order.
    Outcome,
    /// An event of an existing order recorded against no order, or another.
    WrongOrder,
    /// The order's final status is not the model's.
    FinalStatus,
    /// A confirmation count other than the model's.
    Confirmation,
    /// A refund-notice count other than the model's (at most one, ever).
    RefundNotice,
    /// More than one refund-notice row ever enqueued for the order.
    NoticeEnqueuedTwice,
    /// A shipment of an order the model never shipped.
    ShippedUnpaid,
    /// A paid, unrefunded order without exactly one shipment.
    ShipmentCount,
    /// A shipment first claimed after its order's refund was committed: the
    /// refund did not stop it.
    ShipmentClaimedAfterRefund,
    /// A shipment claimed again after its order's refund was committed: its
    /// call under way failed and it was retried.
    ShipmentRetriedAfterRefund,
    /// A refunded order's shipment left pending or dead.
    ShipmentNotStopped,
    /// The downstream performed the shipment and answered it promptly, yet
    /// the row says cancelled.
    PerformedButCancelled,
    /// A row recorded done whose effect the downstream never created.
    DoneWithoutEffect,
    /// An event id claimed twice without its record being pruned.
    ClaimedTwice,
    /// An unmatched event applied to its order more than once.
    AppliedTwice,
    /// An event recorded `unmatched` although every delivery of it was sent
    /// after its order's creation had committed.
    UnmatchedWhileOrderExisted,
    /// An event of an order created after it, still `unmatched` at the end:
    /// nothing applied it once the order existed.
    UnmatchedNeverApplied,
    /// An event the provider delivered that was never claimed, or a 2xx
    /// whose status differs from the claim's.
    Acknowledgement,
    /// A key with more than one effect.
    DoubleEffect,
}

#[derive(Debug, Default)]
pub struct Report {
    pub orders: usize,
    pub events: usize,
    pub deliveries: usize,
    pub duplicate_deliveries: usize,
    pub payment_refund_pairs_overlapping: usize,
    pub overlapping_with_payment_committed_first: usize,
    pub refunds_after_payment: usize,
    pub refunds_with_shipment_claim_in_flight: usize,
    pub shipments_under_way_then_done: usize,
    pub shipments_under_way_then_cancelled_with_effect: usize,
    /// Refunded orders whose shipment was performed and promptly answered
    /// yet recorded cancelled, excused by a kill or failover around its call.
    pub performed_but_cancelled_excused: usize,
    /// Orders created after their first events were sent.
    pub late_orders: usize,
    /// Events of those answered `unmatched`, and applied by the reconciler.
    pub answered_unmatched: usize,
    pub applied_later: usize,
    pub violations: BTreeMap<Violation, Vec<i64>>,
    /// Every violation with its order's history, by kind.
    pub details: BTreeMap<Violation, Vec<String>>,
}

impl Report {
    pub fn total_violations(&self) -> usize {
        self.violations.values().map(Vec::len).sum()
    }

    fn flag(&mut self, v: Violation, order: i64, why: &str) {
        self.violations.entry(v).or_default().push(order);
        self.details
            .entry(v)
            .or_default()
            .push(format!("order {order}: {v:?}: {why}"));
    }

    /// Every violation's history, for the report file.
    pub fn all_details(&self) -> String {
        self.details
            .values()
            .flatten()
            .map(|d| format!("  {d}\n"))
            .collect()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "history: {} orders, {} events, {} deliveries ({} duplicates or retries)",
            self.orders, self.events, self.deliveries, self.duplicate_deliveries
        )?;
        writeln!(
            f,
            "history: payment/refund pairs in flight together {} (payment committed first in {}); \
             refunds after a payment {}, {} of them with the shipment's call under way \
             ({} then done, {} cancelled after the downstream did ship); performed but \
             recorded cancelled around a kill or failover {}",
            self.payment_refund_pairs_overlapping,
            self.overlapping_with_payment_committed_first,
            self.refunds_after_payment,
            self.refunds_with_shipment_claim_in_flight,
            self.shipments_under_way_then_done,
            self.shipments_under_way_then_cancelled_with_effect,
            self.performed_but_cancelled_excused,
        )?;
        writeln!(
            f,
            "history: orders created after their payments {}: {} events answered unmatched, {} applied once the order existed",
            self.late_orders, self.answered_unmatched, self.applied_later
        )?;
        let by_kind: Vec<String> = self
            .violations
            .iter()
            .map(|(v, orders)| format!("{v:?} {}", orders.len()))
            .collect();
        writeln!(
            f,
            "history: violations {}{}",
            self.total_violations(),
            if by_kind.is_empty() {
                String::new()
            } else {
                format!(" ({})", by_kind.join(", "))
            }
        )?;
        // A few of each kind; the report file has them all.
        for details in self.details.values() {
            for d in details.iter().take(3) {
                writeln!(f, "  {d}")?;
            }
        }
        Ok(())
    }
}

fn event_kind(event_type: &str) -> EventKind {
    match event_type {
        "payment.succeeded" => EventKind::PaymentSucceeded,
        "payment.refunded" => EventKind::PaymentRefunded,
        _ => EventKind::Other,
    }
}

fn key(kind: CommandKind, order: i64) -> String {
    kind.idempotency_key(order)
}

/// A rule over one event as delivered in one phase.
type EventRule = fn(&Evidence, &Delivered<'_>, &mut Report);

/// A rule over one order's history.
type OrderRule = fn(&OrderHistory<'_>, &mut Report);

/// The rules over each delivered event, in the order they are checked.
const EVENT_RULES: [EventRule; 5] = [
    claimed_once_per_phase,
    acknowledged_as_recorded,
    applied_at_most_once,
    unmatched_only_before_its_order,
    unmatched_applied_once_its_order_exists,
];

/// The rules over each order, in the order they are checked.
const ORDER_RULES: [OrderRule; 11] = [
    outcomes_follow_the_rule,
    final_status_is_the_models,
    confirmations_as_the_model,
    refund_notices_as_the_model,
    refund_notice_enqueued_at_most_once,
    done_rows_have_their_effect,
    unpaid_orders_never_ship,
    paid_orders_ship_once,
    refund_stops_later_claims,
    refund_leaves_no_shipment_pending,
    performed_shipment_recorded_done,
];

/// Runs every rule over the evidence and gathers what breaks them, with
/// what the run's concurrency actually hit.
pub fn check(e: &Evidence) -> Report {
    let mut r = Report {
        orders: e.orders.len(),
        events: e.planned.len(),
        deliveries: e.deliveries.len(),
        late_orders: e.late_orders.len(),
        ..Report::default()
    };
    let claims_of = claims_by_event(e);
    let delivered = delivered(e, &claims_of);
    r.duplicate_deliveries = e.deliveries.len() - delivered.len();
    for d in &delivered {
        for rule in EVENT_RULES {
            rule(e, d, &mut r);
        }
        count_answered_unmatched(e, d, &mut r);
    }
    one_effect_per_key(e, &mut r);
    for c in e.claims.iter().filter(|c| !claimed_before_its_order(e, c)) {
        recorded_against_its_planned_order(e, c, &mut r);
        r.applied_later += usize::from(c.op == "UPDATE");
    }
    for history in order_histories(e) {
        for rule in ORDER_RULES {
            rule(&history, &mut r);
        }
        count_refunds_after_payment(&history, &mut r);
        count_overlapping_payment_and_refund(&history, &mut r);
    }
    r
}
