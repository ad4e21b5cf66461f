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
             ({} then done, {} cancelled after the downstream did ship)",
            self.payment_refund_pairs_overlapping,
            self.overlapping_with_payment_committed_first,
            self.refunds_after_payment,
            self.refunds_with_shipment_claim_in_flight,
            self.shipments_under_way_then_done,
            self.shipments_under_way_then_cancelled_with_effect,
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

fn claims_by_event(e: &Evidence) -> HashMap<&str, Vec<&Claim>> {
    let mut claims_of: HashMap<&str, Vec<&Claim>> = HashMap::new();
    for c in &e.claims {
        claims_of.entry(&c.event_id).or_default().push(c);
    }
    claims_of
}

/// One event as delivered in one phase, beside the database's claims of it.
struct Delivered<'e> {
    id: &'e str,
    phase: u8,
    /// The order it was planned for; 0 for none.
    order: i64,
    /// Every claim and application of the id, in both phases.
    claims: &'e [&'e Claim],
    /// Its deliveries in this phase that got a 200.
    acked: Vec<&'e Delivery>,
    recorded: Recorded<'e>,
}

/// What the database recorded of a delivered event, as far as its
/// acknowledgements let the rules judge.
enum Recorded<'e> {
    /// No delivery got a 200: nothing further is checked.
    NeverAcked,
    /// Acknowledged, with no claim up to this phase.
    NeverClaimed,
    /// Its latest claim up to this phase, and the applications after it
    /// (what a delivery may have been answered, besides the claim's outcome).
    Claimed {
        claim: &'e Claim,
        applications: Vec<&'e Claim>,
    },
}

/// Every event delivered, once per phase it was delivered in.
fn delivered<'e>(e: &'e Evidence, claims_of: &'e HashMap<&str, Vec<&Claim>>) -> Vec<Delivered<'e>> {
    let mut delivered_ids: HashMap<(&str, u8), usize> = HashMap::new();
    for d in &e.deliveries {
        *delivered_ids.entry((&d.event_id, d.phase)).or_default() += 1;
    }
    delivered_ids
        .into_keys()
        .map(|(id, phase)| {
            let claims: &[&Claim] = claims_of.get(id).map_or(&[], Vec::as_slice);
            let acked: Vec<&Delivery> = e
                .deliveries
                .iter()
                .filter(|d| d.event_id == id && d.phase == phase && d.status == 200)
                .collect();
            let claim = claims
                .iter()
                .filter(|c| c.phase <= phase && c.op == "INSERT")
                .max_by_key(|c| c.seq);
            let recorded = match claim {
                _ if acked.is_empty() => Recorded::NeverAcked,
                None => Recorded::NeverClaimed,
                Some(claim) => Recorded::Claimed {
                    claim,
                    applications: claims
                        .iter()
                        .filter(|c| c.op == "UPDATE" && c.seq > claim.seq)
                        .copied()
                        .collect(),
                },
            };
            Delivered {
                id,
                phase,
                order: e.planned.get(id).and_then(|(_, o)| *o).unwrap_or(0),
                claims,
                acked,
                recorded,
            }
        })
        .collect()
}

impl<'e> Delivered<'e> {
    /// Its claim, if it was acknowledged and claimed, and when its order was
    /// created if that came after the test started and the claim found none.
    fn unmatched_of_late_order(&self, e: &Evidence) -> Option<(&'e Claim, &[&'e Claim], i64)> {
        let Recorded::Claimed { claim, applications } = &self.recorded else {
            return None;
        };
        let &created_us = e.late_orders.get(&self.order)?;
        (claim.status == "unmatched").then_some((*claim, applications.as_slice(), created_us))
    }
}

/// An event id is claimed once per phase, and again in a later phase only if
/// its record was pruned.
fn claimed_once_per_phase(e: &Evidence, d: &Delivered<'_>, r: &mut Report) {
    let (id, phase) = (d.id, d.phase);
    let in_phase = d
        .claims
        .iter()
        .filter(|c| c.phase == phase && c.op == "INSERT")
        .count();
    let earlier = d.claims.iter().any(|c| c.phase < phase && c.op == "INSERT");
    let expected = usize::from(!earlier || e.pruned.contains(id));
    if in_phase > expected {
        r.flag(
            Violation::ClaimedTwice,
            d.order,
            &format!("{id} claimed {in_phase} times in phase {phase}"),
        );
    }
}

/// Every delivered event gets a 200, is claimed, and every 200 answers the
/// claim's outcome (or an application's).
fn acknowledged_as_recorded(_: &Evidence, d: &Delivered<'_>, r: &mut Report) {
    let (id, phase, order) = (d.id, d.phase, d.order);
    match &d.recorded {
        Recorded::NeverAcked => r.flag(
            Violation::Acknowledgement,
            order,
            &format!("{id} never got a 200 in phase {phase}"),
        ),
        Recorded::NeverClaimed => r.flag(
            Violation::Acknowledgement,
            order,
            &format!("{id} acknowledged but never claimed"),
        ),
        Recorded::Claimed { claim, applications } => {
            for d in &d.acked {
                let answered = d.outcome.as_deref();
                if answered != Some(claim.status.as_str())
                    && !applications.iter().any(|a| answered == Some(a.status.as_str()))
                {
                    r.flag(
                        Violation::Acknowledgement,
                        order,
                        &format!("{id} answered {:?} but recorded {}", d.outcome, claim.status),
                    );
                }
            }
        }
    }
}

/// An unmatched event is applied to its order at most once.
fn applied_at_most_once(_: &Evidence, d: &Delivered<'_>, r: &mut Report) {
    if let Recorded::Claimed { applications, .. } = &d.recorded
        && applications.len() > 1
    {
        r.flag(
            Violation::AppliedTwice,
            d.order,
            &format!(
                "{} applied {} times once its order existed",
                d.id,
                applications.len()
            ),
        );
    }
}

/// An event is recorded `unmatched` only if a delivery of it was sent before
/// its order's creation committed.
fn unmatched_only_before_its_order(e: &Evidence, d: &Delivered<'_>, r: &mut Report) {
    let Some((_, _, created_us)) = d.unmatched_of_late_order(e) else {
        return;
    };
    let sent_after = e
        .deliveries
        .iter()
        .filter(|x| x.event_id == d.id && x.phase == d.phase)
        .all(|x| x.sent_us > created_us);
    if sent_after {
        r.flag(
            Violation::UnmatchedWhileOrderExisted,
            d.order,
            &format!(
                "{} recorded unmatched, every delivery sent after its order was created",
                d.id
            ),
        );
    }
}

/// An event recorded `unmatched` is applied once its order exists, unless the
/// ingest ignores its type.
fn unmatched_applied_once_its_order_exists(e: &Evidence, d: &Delivered<'_>, r: &mut Report) {
    let Some((claim, applications, _)) = d.unmatched_of_late_order(e) else {
        return;
    };
    if applications.is_empty() && event_kind(&claim.event_type) != EventKind::Other {
        r.flag(
            Violation::UnmatchedNeverApplied,
            d.order,
            &format!("{} still unmatched though its order was created", d.id),
        );
    }
}

/// Not a rule: the events of late orders answered `unmatched`.
fn count_answered_unmatched(e: &Evidence, d: &Delivered<'_>, r: &mut Report) {
    r.answered_unmatched += usize::from(d.unmatched_of_late_order(e).is_some());
}

/// The downstream creates each key's effect at most once.
fn one_effect_per_key(e: &Evidence, r: &mut Report) {
    for (k, rec) in &e.keys {
        if rec.effects > 1 {
            let order = k.rsplit('-').next().and_then(|o| o.parse().ok()).unwrap_or(0);
            r.flag(
                Violation::DoubleEffect,
                order,
                &format!("{k}: {} effects", rec.effects),
            );
        }
    }
}

/// The order a claim's event was planned for; none for a type the ingest
/// ignores, which is recorded against no order by design.
fn planned_order(e: &Evidence, c: &Claim) -> Option<i64> {
    e.planned
        .get(&c.event_id)
        .and_then(|(_, o)| *o)
        .filter(|_| event_kind(&c.event_type) != EventKind::Other)
}

/// Claimed `unmatched` before its order existed: the model takes the
/// application (`UPDATE`) instead.
fn claimed_before_its_order(e: &Evidence, c: &Claim) -> bool {
    c.op == "INSERT"
        && c.status == "unmatched"
        && planned_order(e, c).is_some_and(|o| e.late_orders.contains_key(&o))
}

/// An event of an existing order is recorded against that order.
fn recorded_against_its_planned_order(e: &Evidence, c: &Claim, r: &mut Report) {
    let planned = planned_order(e, c);
    if planned.is_some() && c.order_id != planned {
        r.flag(
            Violation::WrongOrder,
            planned.unwrap_or(0),
            &format!(
                "{} recorded {} against order {:?}, planned for {:?}",
                c.event_id, c.status, c.order_id, planned
            ),
        );
    }
}

/// One order's evidence in commit order, and the model's reading of it.
struct OrderHistory<'e> {
    e: &'e Evidence,
    order: i64,
    /// Its claims in commit order, each under the order its event was
    /// planned for, so an event recorded against no order (or another) is
    /// checked with its own.
    events: Vec<&'e Claim>,
    /// The rule's transition of each event, from the model's state before it.
    transitions: Vec<Transition>,
    /// The model's final status.
    state: OrderStatus,
    /// Commands the model enqueued, by kind.
    enqueued: HashMap<CommandKind, u32>,
    /// The refund that must stop a shipment the model enqueued.
    stopped_by: Option<&'e Claim>,
    /// Its outbox writes, in the order recorded.
    writes: Vec<&'e RowWrite>,
}

/// Every order's history, in order id order.
fn order_histories(e: &Evidence) -> Vec<OrderHistory<'_>> {
    let mut by_order: BTreeMap<i64, Vec<&Claim>> = BTreeMap::new();
    for c in e.claims.iter().filter(|c| !claimed_before_its_order(e, c)) {
        if let Some(o) = planned_order(e, c).or(c.order_id) {
            by_order.entry(o).or_default().push(c);
        }
    }
    let mut writes_of: HashMap<i64, Vec<&RowWrite>> = HashMap::new();
    for w in &e.writes {
        writes_of.entry(w.order_id).or_default().push(w);
    }
    let mut orders: Vec<&i64> = e.orders.keys().collect();
    orders.sort();
    orders
        .into_iter()
        .map(|&order| {
            let mut events = by_order.get(&order).cloned().unwrap_or_default();
            events.sort_by_key(|c| c.seq);
            let mut history = OrderHistory {
                e,
                order,
                events,
                transitions: Vec::new(),
                state: OrderStatus::Pending,
                enqueued: HashMap::new(),
                stopped_by: None,
                writes: writes_of.remove(&order).unwrap_or_default(),
            };
            history.apply_the_model();
            history
        })
        .collect()
}

/// What the model says of an order's shipment.
enum Shipment<'e> {
    /// Never enqueued: the order was never paid.
    Unpaid,
    /// Enqueued and never stopped: exactly one.
    Paid,
    /// Enqueued, then stopped by this refund.
    Refunded(&'e Claim),
}

impl<'e> OrderHistory<'e> {
    /// `domain::transition` applied to the events in commit order.
    fn apply_the_model(&mut self) {
        for c in &self.events {
            let t = domain::transition(event_kind(&c.event_type), Some(self.state));
            self.transitions.push(t);
            for k in t.enqueue {
                *self.enqueued.entry(*k).or_default() += 1;
            }
            if event_kind(&c.event_type) == EventKind::PaymentRefunded
                && self.state == OrderStatus::Paid
                && self.enqueued.contains_key(&CommandKind::ShipOrder)
            {
                self.stopped_by = Some(c);
            }
            self.state = t.set_status.unwrap_or(self.state);
        }
    }

    /// The order's events, shipment writes and shipment calls, for a
    /// violation's message.
    fn history(&self) -> String {
        let mut h = String::new();
        for c in &self.events {
            let _ = write!(
                h,
                "[#{} {} {} -> {} at {}] ",
                c.seq, c.event_id, c.event_type, c.status, c.at_us
            );
        }
        for w in &self.writes {
            if w.kind == CommandKind::ShipOrder.as_str() {
                let _ = write!(
                    h,
                    "[ship #{} {} {:?}->{}{}{} at {}] ",
                    w.seq,
                    w.op,
                    w.old_status,
                    w.new_status,
                    if w.claimed { " claimed" } else { "" },
                    w.old_owner
                        .as_deref()
                        .map(|o| format!(" (held by {o})"))
                        .unwrap_or_default(),
                    w.at_us
                );
            }
        }
        for c in self.ship_calls() {
            let _ = write!(
                h,
                "[ship call {}..{} {}{}{}] ",
                c.arrived_us,
                c.ended_us,
                c.status,
                if c.effect { " effect" } else { "" },
                if c.hung { " hung" } else { "" }
            );
        }
        h
    }

    /// Effects of `kind` the downstream created for the order.
    fn effects(&self, kind: CommandKind) -> u64 {
        self.e.keys.get(&key(kind, self.order)).map_or(0, |k| k.effects)
    }

    /// Commands of `kind` the model enqueued.
    fn expect(&self, kind: CommandKind) -> u64 {
        u64::from(self.enqueued.get(&kind).copied().unwrap_or(0))
    }

    fn shipment(&self) -> Shipment<'e> {
        match (self.expect(CommandKind::ShipOrder), self.stopped_by) {
            (0, _) => Shipment::Unpaid,
            (_, None) => Shipment::Paid,
            (_, Some(refund)) => Shipment::Refunded(refund),
        }
    }

    /// The final status of the order's shipment row.
    fn ship_row(&self) -> Option<&'e String> {
        self.e
            .rows
            .get(&(CommandKind::ShipOrder.as_str().to_owned(), self.order))
    }

    fn ship_writes(&self) -> impl Iterator<Item = &'e RowWrite> + '_ {
        self.writes
            .iter()
            .copied()
            .filter(|w| w.kind == CommandKind::ShipOrder.as_str())
    }

    fn ship_calls(&self) -> impl Iterator<Item = &'e CallRecord> {
        self.e
            .keys
            .get(&key(CommandKind::ShipOrder, self.order))
            .into_iter()
            .flat_map(|k| &k.calls)
    }

    /// When the provider first held a 200 for the event in the phase.
    fn acked_at(&self, id: &str, phase: u8) -> Option<i64> {
        self.e
            .deliveries
            .iter()
            .filter(|d| d.event_id == id && d.phase == phase)
            .filter_map(|d| d.acked_us)
            .min()
    }
}

/// Each event's recorded outcome is the rule's, applied in commit order.
fn outcomes_follow_the_rule(h: &OrderHistory<'_>, r: &mut Report) {
    for (c, t) in h.events.iter().zip(&h.transitions) {
        if c.status != t.outcome.as_str() {
            r.flag(
                Violation::Outcome,
                h.order,
                &format!(
                    "{} recorded {} but the rule gives {}: {}",
                    c.event_id,
                    c.status,
                    t.outcome.as_str(),
                    h.history()
                ),
            );
        }
    }
}

/// The order ends in the model's status.
fn final_status_is_the_models(h: &OrderHistory<'_>, r: &mut Report) {
    let ended = h.e.orders.get(&h.order);
    if ended.map(String::as_str) != Some(h.state.as_str()) {
        r.flag(
            Violation::FinalStatus,
            h.order,
            &format!(
                "ends {:?}, the model {}: {}",
                ended,
                h.state.as_str(),
                h.history()
            ),
        );
    }
}

/// As many confirmations as the model enqueued.
fn confirmations_as_the_model(h: &OrderHistory<'_>, r: &mut Report) {
    let (effects, expected) = (
        h.effects(CommandKind::SendConfirmation),
        h.expect(CommandKind::SendConfirmation),
    );
    if effects != expected {
        r.flag(
            Violation::Confirmation,
            h.order,
            &format!("{effects} confirmations, the model {expected}: {}", h.history()),
        );
    }
}

/// As many refund notices as the model enqueued.
fn refund_notices_as_the_model(h: &OrderHistory<'_>, r: &mut Report) {
    let (effects, expected) = (
        h.effects(CommandKind::SendRefundNotice),
        h.expect(CommandKind::SendRefundNotice),
    );
    if effects != expected {
        r.flag(
            Violation::RefundNotice,
            h.order,
            &format!("{effects} refund notices, the model {expected}: {}", h.history()),
        );
    }
}

/// At most one refund-notice row is ever enqueued for an order.
fn refund_notice_enqueued_at_most_once(h: &OrderHistory<'_>, r: &mut Report) {
    let notice_rows = h
        .writes
        .iter()
        .filter(|w| w.op == "INSERT" && w.kind == CommandKind::SendRefundNotice.as_str())
        .count();
    if notice_rows > 1 {
        r.flag(
            Violation::NoticeEnqueuedTwice,
            h.order,
            &format!("{notice_rows} refund-notice rows enqueued: {}", h.history()),
        );
    }
}

/// A shipment row recorded done has its effect at the downstream.
fn done_rows_have_their_effect(h: &OrderHistory<'_>, r: &mut Report) {
    if h.ship_row().is_some_and(|s| s == "done") && h.effects(CommandKind::ShipOrder) == 0 {
        r.flag(Violation::DoneWithoutEffect, h.order, &h.history());
    }
}

/// An order the model never paid never ships.
fn unpaid_orders_never_ship(h: &OrderHistory<'_>, r: &mut Report) {
    if let Shipment::Unpaid = h.shipment()
        && h.effects(CommandKind::ShipOrder) > 0
    {
        r.flag(Violation::ShippedUnpaid, h.order, &h.history());
    }
}

/// A paid, unrefunded order ships exactly once.
fn paid_orders_ship_once(h: &OrderHistory<'_>, r: &mut Report) {
    let ship_effects = h.effects(CommandKind::ShipOrder);
    if let Shipment::Paid = h.shipment()
        && ship_effects != 1
    {
        r.flag(
            Violation::ShipmentCount,
            h.order,
            &format!("{ship_effects} shipments: {}", h.history()),
        );
    }
}

/// No shipment is claimed after its order's refund was certainly committed
/// (the provider's 200, unless the reconciler applied the refund later: then
/// no moment is certain, and this rule is not checked).
fn refund_stops_later_claims(h: &OrderHistory<'_>, r: &mut Report) {
    let Shipment::Refunded(refund) = h.shipment() else {
        return;
    };
    let committed = h
        .acked_at(&refund.event_id, refund.phase)
        .filter(|_| refund.op == "INSERT");
    let Some(acked) = committed else {
        return;
    };
    let late: Vec<&RowWrite> = h.ship_writes().filter(|w| w.claimed && w.at_us > acked).collect();
    if !late.is_empty() {
        let claimed_before = h.ship_writes().any(|w| w.claimed && w.at_us < refund.at_us);
        r.flag(
            if claimed_before {
                Violation::ShipmentRetriedAfterRefund
            } else {
                Violation::ShipmentClaimedAfterRefund
            },
            h.order,
            &format!(
                "{} claim(s) after the refund {} was answered at {acked}: {}",
                late.len(),
                refund.event_id,
                h.history()
            ),
        );
    }
}

/// A refunded order's shipment is not left pending or dead.
fn refund_leaves_no_shipment_pending(h: &OrderHistory<'_>, r: &mut Report) {
    let ship_row = h.ship_row();
    if let Shipment::Refunded(_) = h.shipment()
        && ship_row.is_some_and(|s| s == "pending" || s == "dead")
    {
        r.flag(
            Violation::ShipmentNotStopped,
            h.order,
            &format!("shipment left {:?}: {}", ship_row, h.history()),
        );
    }
}

/// A refunded order's shipment the downstream performed and promptly
/// answered with success was recorded done at some point: the relay knew
/// (unless a kill or a restart took that knowledge away before it was
/// recorded).
fn performed_shipment_recorded_done(h: &OrderHistory<'_>, r: &mut Report) {
    let Shipment::Refunded(_) = h.shipment() else {
        return;
    };
    let recorded_done = h.ship_writes().any(|w| w.new_status == "done");
    if recorded_done || h.effects(CommandKind::ShipOrder) == 0 {
        return;
    }
    let prompt = h.ship_calls().find(|c| {
        c.effect
            && !c.hung
            && (200..300).contains(&c.status)
            // Answered within a quarter of the relay's timeout: the relay
            // got it, unless it stalled for the rest.
            && ((c.ended_us - c.arrived_us) as i64) < h.e.http_timeout_us / 4
    });
    if let Some(call) = prompt {
        let excused =
            h.e.disruptions
                .iter()
                .any(|&t| t >= call.arrived_us as i64 && t <= call.ended_us as i64 + 60_000_000);
        if !excused {
            r.flag(Violation::PerformedButCancelled, h.order, &h.history());
        }
    }
}

/// Not a rule: refunds after a payment; of those, the ones whose shipment
/// call was under way when the refund's statement ran, and how those
/// shipments ended.
fn count_refunds_after_payment(h: &OrderHistory<'_>, r: &mut Report) {
    let Shipment::Refunded(refund) = h.shipment() else {
        return;
    };
    r.refunds_after_payment += 1;
    // Under way: the last claim or completion of the row clocked before the
    // refund's claim was a claim.
    let in_flight = h
        .ship_writes()
        .filter(|w| {
            let completion = w.old_owner.is_some() && w.new_owner.is_none();
            w.at_us < refund.at_us && (w.claimed || completion)
        })
        .max_by_key(|w| w.at_us)
        .is_some_and(|w| w.claimed);
    if in_flight {
        r.refunds_with_shipment_claim_in_flight += 1;
        match h.ship_row().map(String::as_str) {
            Some("done") => r.shipments_under_way_then_done += 1,
            Some("cancelled") if h.effects(CommandKind::ShipOrder) > 0 => {
                r.shipments_under_way_then_cancelled_with_effect += 1;
            }
            _ => {}
        }
    }
}

/// Not a rule: concurrency actually hit, a payment and a refund of the order
/// in flight at the same time, and which committed first.
fn count_overlapping_payment_and_refund(h: &OrderHistory<'_>, r: &mut Report) {
    let e = h.e;
    let interval_of = |id: &str| {
        let ds: Vec<&Delivery> = e
            .deliveries
            .iter()
            .filter(|d| d.event_id == id && d.phase == 1)
            .collect();
        let start = ds.iter().map(|d| d.sent_us).min()?;
        let end = ds.iter().filter_map(|d| d.acked_us).max()?;
        Some((start, end))
    };
    let ids = |kind: EventKind| {
        e.planned
            .iter()
            .filter(move |(_, (t, o))| *o == Some(h.order) && event_kind(t) == kind)
            .map(|(id, _)| id.as_str())
    };
    let seq = |id: &str| {
        h.events
            .iter()
            .find(|c| c.event_id == id && c.phase == 1)
            .map(|c| c.seq)
    };
    let mut overlapped = false;
    let mut payment_first = false;
    for p in ids(EventKind::PaymentSucceeded) {
        for q in ids(EventKind::PaymentRefunded) {
            if let (Some((ps, pe)), Some((qs, qe))) = (interval_of(p), interval_of(q))
                && ps < qe
                && qs < pe
            {
                overlapped = true;
                if let (Some(a), Some(b)) = (seq(p), seq(q))
                    && a < b
                {
                    payment_first = true;
                }
            }
        }
    }
    r.payment_refund_pairs_overlapping += usize::from(overlapped);
    r.overlapping_with_payment_committed_first += usize::from(payment_first);
}
