//! The rules over each order's history, against the domain model applied
//! in commit order.

use super::*;

/// One order's evidence in commit order, and the model's reading of it.
pub(super) struct OrderHistory<'e> {
    pub(super) e: &'e Evidence,
    pub(super) order: i64,
    /// Its claims in commit order, each under the order its event was
    /// planned for, so an event recorded against no order (or another) is
    /// checked with its own.
    pub(super) events: Vec<&'e Claim>,
    /// The rule's transition of each event, from the model's state before it.
    pub(super) transitions: Vec<Transition>,
    /// The model's final status.
    pub(super) state: OrderStatus,
    /// Commands the model enqueued, by kind.
    pub(super) enqueued: HashMap<CommandKind, u32>,
    /// The refund that must stop a shipment the model enqueued.
    pub(super) stopped_by: Option<&'e Claim>,
    /// Its outbox writes, in the order recorded.
    pub(super) writes: Vec<&'e RowWrite>,
}

/// Every order's history, in order id order.
pub(super) fn order_histories(e: &Evidence) -> Vec<OrderHistory<'_>> {
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
pub(super) enum Shipment<'e> {
    /// Never enqueued: the order was never paid.
    Unpaid,
    /// Enqueued and never stopped: exactly one.
    Paid,
    /// Enqueued, then stopped by this refund.
    Refunded(&'e Claim),
}

impl<'e> OrderHistory<'e> {
    /// `domain::transition` applied to the events in commit order.
    pub(super) fn apply_the_model(&mut self) {
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
    pub(super) fn history(&self) -> String {
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
    pub(super) fn effects(&self, kind: CommandKind) -> u64 {
        self.e.keys.get(&key(kind, self.order)).map_or(0, |k| k.effects)
    }

    /// Commands of `kind` the model enqueued.
    pub(super) fn expect(&self, kind: CommandKind) -> u64 {
        u64::from(self.enqueued.get(&kind).copied().unwrap_or(0))
    }

    pub(super) fn shipment(&self) -> Shipment<'e> {
        match (self.expect(CommandKind::ShipOrder), self.stopped_by) {
            (0, _) => Shipment::Unpaid,
            (_, None) => Shipment::Paid,
            (_, Some(refund)) => Shipment::Refunded(refund),
        }
    }

    /// The final status of the order's shipment row.
    pub(super) fn ship_row(&self) -> Option<&'e String> {
        self.e
            .rows
            .get(&(CommandKind::ShipOrder.as_str().to_owned(), self.order))
    }

    pub(super) fn ship_writes(&self) -> impl Iterator<Item = &'e RowWrite> + '_ {
        self.writes
            .iter()
            .copied()
            .filter(|w| w.kind == CommandKind::ShipOrder.as_str())
    }

    pub(super) fn ship_calls(&self) -> impl Iterator<Item = &'e CallRecord> {
        self.e
            .keys
            .get(&key(CommandKind::ShipOrder, self.order))
            .into_iter()
            .flat_map(|k| &k.calls)
    }

    /// When the provider first held a 200 for the event in the phase.
    pub(super) fn acked_at(&self, id: &str, phase: u8) -> Option<i64> {
        self.e
            .deliveries
            .iter()
            .filter(|d| d.event_id == id && d.phase == phase)
            .filter_map(|d| d.acked_us)
            .min()
    }
}

/// Each event's recorded outcome is the rule's, applied in commit order.
pub(super) fn outcomes_follow_the_rule(h: &OrderHistory<'_>, r: &mut Report) {
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
pub(super) fn final_status_is_the_models(h: &OrderHistory<'_>, r: &mut Report) {
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
pub(super) fn confirmations_as_the_model(h: &OrderHistory<'_>, r: &mut Report) {
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
pub(super) fn refund_notices_as_the_model(h: &OrderHistory<'_>, r: &mut Report) {
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
pub(super) fn refund_notice_enqueued_at_most_once(h: &OrderHistory<'_>, r: &mut Report) {
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
pub(super) fn done_rows_have_their_effect(h: &OrderHistory<'_>, r: &mut Report) {
    if h.ship_row().is_some_and(|s| s == "done") && h.effects(CommandKind::ShipOrder) == 0 {
        r.flag(Violation::DoneWithoutEffect, h.order, &h.history());
    }
}

/// An order the model never paid never ships.
pub(super) fn unpaid_orders_never_ship(h: &OrderHistory<'_>, r: &mut Report) {
    if let Shipment::Unpaid = h.shipment()
        && h.effects(CommandKind::ShipOrder) > 0
    {
        r.flag(Violation::ShippedUnpaid, h.order, &h.history());
    }
}

/// A paid, unrefunded order ships exactly once.
pub(super) fn paid_orders_ship_once(h: &OrderHistory<'_>, r: &mut Report) {
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
pub(super) fn refund_stops_later_claims(h: &OrderHistory<'_>, r: &mut Report) {
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
pub(super) fn refund_leaves_no_shipment_pending(h: &OrderHistory<'_>, r: &mut Report) {
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
/// (unless a kill, a restart or a failover took that knowledge away between
/// the claim and the record: the claim came at most a lease before the call,
/// and a failover loses the relay's last commits, claims included, which
/// wait for no standby).
pub(super) fn performed_shipment_recorded_done(h: &OrderHistory<'_>, r: &mut Report) {
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
        let (earliest_claim, latest_record) = (
            call.arrived_us as i64 - h.e.lease_us,
            call.ended_us as i64 + 60_000_000,
        );
        let excused =
            h.e.disruptions
                .iter()
                .any(|&t| t >= earliest_claim && t <= latest_record);
        if excused {
            r.performed_but_cancelled_excused += 1;
        } else {
            r.flag(Violation::PerformedButCancelled, h.order, &h.history());
        }
    }
}

/// Not a rule: refunds after a payment; of those, the ones whose shipment
/// call was under way when the refund's statement ran, and how those
/// shipments ended.
pub(super) fn count_refunds_after_payment(h: &OrderHistory<'_>, r: &mut Report) {
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
pub(super) fn count_overlapping_payment_and_refund(h: &OrderHistory<'_>, r: &mut Report) {
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
