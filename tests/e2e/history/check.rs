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

use domain::{CommandKind, EventKind, OrderStatus};
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

pub fn check(e: &Evidence) -> Report {
    let mut r = Report {
        orders: e.orders.len(),
        events: e.planned.len(),
        deliveries: e.deliveries.len(),
        ..Report::default()
    };
    let mut delivered_ids: HashMap<(&str, u8), usize> = HashMap::new();
    for d in &e.deliveries {
        *delivered_ids.entry((&d.event_id, d.phase)).or_default() += 1;
    }
    r.duplicate_deliveries = e.deliveries.len() - delivered_ids.len();

    // Claims per event id, and the provider's view of each.
    let mut claims_of: HashMap<&str, Vec<&Claim>> = HashMap::new();
    for c in &e.claims {
        claims_of.entry(&c.event_id).or_default().push(c);
    }
    for &(id, phase) in delivered_ids.keys() {
        let order = e.planned.get(id).and_then(|(_, o)| *o).unwrap_or(0);
        let in_phase: Vec<&&Claim> = claims_of
            .get(id)
            .map(|cs| {
                cs.iter()
                    .filter(|c| c.phase == phase && c.op == "INSERT")
                    .collect()
            })
            .unwrap_or_default();
        let earlier = claims_of
            .get(id)
            .is_some_and(|cs| cs.iter().any(|c| c.phase < phase && c.op == "INSERT"));
        let expected = usize::from(!earlier || e.pruned.contains(id));
        if in_phase.len() > expected {
            r.flag(
                Violation::ClaimedTwice,
                order,
                &format!("{id} claimed {} times in phase {phase}", in_phase.len()),
            );
        }
        let acked: Vec<&Delivery> = e
            .deliveries
            .iter()
            .filter(|d| d.event_id == id && d.phase == phase && d.status == 200)
            .collect();
        if acked.is_empty() {
            r.flag(
                Violation::Acknowledgement,
                order,
                &format!("{id} never got a 200 in phase {phase}"),
            );
            continue;
        }
        let Some(claim) = claims_of.get(id).and_then(|cs| {
            cs.iter()
                .filter(|c| c.phase <= phase && c.op == "INSERT")
                .max_by_key(|c| c.seq)
        }) else {
            r.flag(
                Violation::Acknowledgement,
                order,
                &format!("{id} acknowledged but never claimed"),
            );
            continue;
        };
        // What a delivery may have been answered: the claim's outcome, or,
        // once the reconciler applied an unmatched claim, the applied one.
        let applications: Vec<&&Claim> = claims_of
            .get(id)
            .into_iter()
            .flatten()
            .filter(|c| c.op == "UPDATE" && c.seq > claim.seq)
            .collect();
        if applications.len() > 1 {
            r.flag(
                Violation::AppliedTwice,
                order,
                &format!("{id} applied {} times once its order existed", applications.len()),
            );
        }
        for d in acked {
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
        if let Some(&created_us) = e.late_orders.get(&order)
            && claim.status == "unmatched"
        {
            r.answered_unmatched += 1;
            let sent_after = e
                .deliveries
                .iter()
                .filter(|d| d.event_id == id && d.phase == phase)
                .all(|d| d.sent_us > created_us);
            if sent_after {
                r.flag(
                    Violation::UnmatchedWhileOrderExisted,
                    order,
                    &format!("{id} recorded unmatched, every delivery sent after its order was created"),
                );
            }
            if applications.is_empty() && event_kind(&claim.event_type) != EventKind::Other {
                r.flag(
                    Violation::UnmatchedNeverApplied,
                    order,
                    &format!("{id} still unmatched though its order was created"),
                );
            }
        }
    }
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

    // Per order: each claim under the order its event was planned for, so an
    // event recorded against no order (or another) is checked with its own.
    let mut by_order: BTreeMap<i64, Vec<&Claim>> = BTreeMap::new();
    for c in &e.claims {
        // Ignored types are recorded against no order, by design.
        let planned = e
            .planned
            .get(&c.event_id)
            .and_then(|(_, o)| *o)
            .filter(|_| event_kind(&c.event_type) != EventKind::Other);
        let early = c.op == "INSERT"
            && c.status == "unmatched"
            && planned.is_some_and(|o| e.late_orders.contains_key(&o));
        if early {
            // Claimed before its order existed: the model takes the
            // application (`UPDATE`) instead.
            continue;
        }
        if c.op == "UPDATE" {
            r.applied_later += 1;
        }
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
        if let Some(o) = planned.or(c.order_id) {
            by_order.entry(o).or_default().push(c);
        }
    }
    let mut writes_of: HashMap<i64, Vec<&RowWrite>> = HashMap::new();
    for w in &e.writes {
        writes_of.entry(w.order_id).or_default().push(w);
    }
    let ack_of = |id: &str, phase: u8| {
        e.deliveries
            .iter()
            .filter(|d| d.event_id == id && d.phase == phase)
            .filter_map(|d| d.acked_us)
            .min()
    };
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
    r.late_orders = e.late_orders.len();
    let mut orders: Vec<&i64> = e.orders.keys().collect();
    orders.sort();
    for &order in orders {
        let mut events = by_order.get(&order).cloned().unwrap_or_default();
        events.sort_by_key(|c| c.seq);
        let history = || {
            let mut h = String::new();
            for c in &events {
                let _ = write!(
                    h,
                    "[#{} {} {} -> {} at {}] ",
                    c.seq, c.event_id, c.event_type, c.status, c.at_us
                );
            }
            for w in writes_of.get(&order).into_iter().flatten() {
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
            if let Some(k) = e.keys.get(&key(CommandKind::ShipOrder, order)) {
                for c in &k.calls {
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
            }
            h
        };

        // The model, in commit order.
        let mut state = OrderStatus::Pending;
        let mut enqueued: HashMap<CommandKind, u32> = HashMap::new();
        let mut stopped_by: Option<&Claim> = None;
        for c in &events {
            let t = domain::transition(event_kind(&c.event_type), Some(state));
            if c.status != t.outcome.as_str() {
                r.flag(
                    Violation::Outcome,
                    order,
                    &format!(
                        "{} recorded {} but the rule gives {}: {}",
                        c.event_id,
                        c.status,
                        t.outcome.as_str(),
                        history()
                    ),
                );
            }
            for k in t.enqueue {
                *enqueued.entry(*k).or_default() += 1;
            }
            if event_kind(&c.event_type) == EventKind::PaymentRefunded
                && state == OrderStatus::Paid
                && enqueued.contains_key(&CommandKind::ShipOrder)
            {
                stopped_by = Some(c);
            }
            state = t.set_status.unwrap_or(state);
        }
        if e.orders.get(&order).map(String::as_str) != Some(state.as_str()) {
            r.flag(
                Violation::FinalStatus,
                order,
                &format!(
                    "ends {:?}, the model {}: {}",
                    e.orders.get(&order),
                    state.as_str(),
                    history()
                ),
            );
        }
        let effects = |kind: CommandKind| e.keys.get(&key(kind, order)).map_or(0, |k| k.effects);
        let expect = |kind: CommandKind| u64::from(enqueued.get(&kind).copied().unwrap_or(0));
        if effects(CommandKind::SendConfirmation) != expect(CommandKind::SendConfirmation) {
            r.flag(
                Violation::Confirmation,
                order,
                &format!(
                    "{} confirmations, the model {}: {}",
                    effects(CommandKind::SendConfirmation),
                    expect(CommandKind::SendConfirmation),
                    history()
                ),
            );
        }
        if effects(CommandKind::SendRefundNotice) != expect(CommandKind::SendRefundNotice) {
            r.flag(
                Violation::RefundNotice,
                order,
                &format!(
                    "{} refund notices, the model {}: {}",
                    effects(CommandKind::SendRefundNotice),
                    expect(CommandKind::SendRefundNotice),
                    history()
                ),
            );
        }
        let notice_rows = writes_of
            .get(&order)
            .into_iter()
            .flatten()
            .filter(|w| w.op == "INSERT" && w.kind == CommandKind::SendRefundNotice.as_str())
            .count();
        if notice_rows > 1 {
            r.flag(
                Violation::NoticeEnqueuedTwice,
                order,
                &format!("{notice_rows} refund-notice rows enqueued: {}", history()),
            );
        }

        // The shipment.
        let ship_key = key(CommandKind::ShipOrder, order);
        let ship_effects = effects(CommandKind::ShipOrder);
        let ship_row = e.rows.get(&(CommandKind::ShipOrder.as_str().to_owned(), order));
        let ship_writes: Vec<&&RowWrite> = writes_of
            .get(&order)
            .into_iter()
            .flatten()
            .filter(|w| w.kind == CommandKind::ShipOrder.as_str())
            .collect();
        if ship_row.is_some_and(|s| s == "done") && ship_effects == 0 {
            r.flag(Violation::DoneWithoutEffect, order, &history());
        }
        match (expect(CommandKind::ShipOrder), stopped_by) {
            (0, _) => {
                if ship_effects > 0 {
                    r.flag(Violation::ShippedUnpaid, order, &history());
                }
            }
            (_, None) => {
                if ship_effects != 1 {
                    r.flag(
                        Violation::ShipmentCount,
                        order,
                        &format!("{ship_effects} shipments: {}", history()),
                    );
                }
            }
            (_, Some(refund)) => {
                r.refunds_after_payment += 1;
                // When the refund was certainly committed: the provider's
                // 200, unless the reconciler applied it later (then no
                // moment is certain, and this rule is not checked).
                let committed = ack_of(&refund.event_id, refund.phase).filter(|_| refund.op == "INSERT");
                if let Some(acked) = committed {
                    let late: Vec<&&&RowWrite> = ship_writes
                        .iter()
                        .filter(|w| w.claimed && w.at_us > acked)
                        .collect();
                    if !late.is_empty() {
                        let claimed_before = ship_writes.iter().any(|w| w.claimed && w.at_us < refund.at_us);
                        r.flag(
                            if claimed_before {
                                Violation::ShipmentRetriedAfterRefund
                            } else {
                                Violation::ShipmentClaimedAfterRefund
                            },
                            order,
                            &format!(
                                "{} claim(s) after the refund {} was answered at {acked}: {}",
                                late.len(),
                                refund.event_id,
                                history()
                            ),
                        );
                    }
                }
                if ship_row.is_some_and(|s| s == "pending" || s == "dead") {
                    r.flag(
                        Violation::ShipmentNotStopped,
                        order,
                        &format!("shipment left {:?}: {}", ship_row, history()),
                    );
                }
                // Was a claim under way when the refund's statement ran? The
                // last claim or completion of the row clocked before the
                // refund's claim says so.
                let in_flight = ship_writes
                    .iter()
                    .filter(|w| {
                        let completion = w.old_owner.is_some() && w.new_owner.is_none();
                        w.at_us < refund.at_us && (w.claimed || completion)
                    })
                    .max_by_key(|w| w.at_us)
                    .is_some_and(|w| w.claimed);
                if in_flight {
                    r.refunds_with_shipment_claim_in_flight += 1;
                    match ship_row.map(String::as_str) {
                        Some("done") => r.shipments_under_way_then_done += 1,
                        Some("cancelled") if ship_effects > 0 => {
                            r.shipments_under_way_then_cancelled_with_effect += 1;
                        }
                        _ => {}
                    }
                }
                let recorded_done = ship_writes.iter().any(|w| w.new_status == "done");
                if !recorded_done && ship_effects > 0 {
                    // Performed and promptly answered with success: the relay
                    // knew, so the row must have said done at some point
                    // (unless a kill or a restart took that knowledge away
                    // before it was recorded).
                    let prompt = e
                        .keys
                        .get(&ship_key)
                        .into_iter()
                        .flat_map(|k| &k.calls)
                        .find(|c| {
                            c.effect
                                && !c.hung
                                && (200..300).contains(&c.status)
                                // Answered within a quarter of the relay's timeout:
                            // the relay got it, unless it stalled for the rest.
                            && ((c.ended_us - c.arrived_us) as i64) < e.http_timeout_us / 4
                        });
                    if let Some(call) = prompt {
                        let excused = e
                            .disruptions
                            .iter()
                            .any(|&t| t >= call.arrived_us as i64 && t <= call.ended_us as i64 + 60_000_000);
                        if !excused {
                            r.flag(Violation::PerformedButCancelled, order, &history());
                        }
                    }
                }
            }
        }

        // Concurrency actually hit: a payment and a refund of this order in
        // flight at the same time.
        let ids = |kind: EventKind| {
            e.planned
                .iter()
                .filter(move |(_, (t, o))| *o == Some(order) && event_kind(t) == kind)
                .map(|(id, _)| id.as_str())
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
                    let seq = |id: &str| {
                        events
                            .iter()
                            .find(|c| c.event_id == id && c.phase == 1)
                            .map(|c| c.seq)
                    };
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
    r
}
