//! The rules over each event as delivered, and over each claim: claimed
//! once per phase, answered as recorded, applied at most once.

use super::*;

pub(super) fn claims_by_event(e: &Evidence) -> HashMap<&str, Vec<&Claim>> {
    let mut claims_of: HashMap<&str, Vec<&Claim>> = HashMap::new();
    for c in &e.claims {
        claims_of.entry(&c.event_id).or_default().push(c);
    }
    claims_of
}

/// One event as delivered in one phase, beside the database's claims of it.
pub(super) struct Delivered<'e> {
    pub(super) id: &'e str,
    pub(super) phase: u8,
    /// The order it was planned for; 0 for none.
    pub(super) order: i64,
    /// Every claim and application of the id, in both phases.
    pub(super) claims: &'e [&'e Claim],
    /// Its deliveries in this phase that got a 200.
    pub(super) acked: Vec<&'e Delivery>,
    pub(super) recorded: Recorded<'e>,
}

/// What the database recorded of a delivered event, as far as its
/// acknowledgements let the rules judge.
pub(super) enum Recorded<'e> {
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
pub(super) fn delivered<'e>(
    e: &'e Evidence,
    claims_of: &'e HashMap<&str, Vec<&Claim>>,
) -> Vec<Delivered<'e>> {
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
    pub(super) fn unmatched_of_late_order(&self, e: &Evidence) -> Option<(&'e Claim, &[&'e Claim], i64)> {
        let Recorded::Claimed { claim, applications } = &self.recorded else {
            return None;
        };
        let &created_us = e.late_orders.get(&self.order)?;
        (claim.status == "unmatched").then_some((*claim, applications.as_slice(), created_us))
    }
}

/// An event id is claimed once per phase, and again in a later phase only if
/// its record was pruned.
pub(super) fn claimed_once_per_phase(e: &Evidence, d: &Delivered<'_>, r: &mut Report) {
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
pub(super) fn acknowledged_as_recorded(_: &Evidence, d: &Delivered<'_>, r: &mut Report) {
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
pub(super) fn applied_at_most_once(_: &Evidence, d: &Delivered<'_>, r: &mut Report) {
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
pub(super) fn unmatched_only_before_its_order(e: &Evidence, d: &Delivered<'_>, r: &mut Report) {
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
pub(super) fn unmatched_applied_once_its_order_exists(e: &Evidence, d: &Delivered<'_>, r: &mut Report) {
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
pub(super) fn count_answered_unmatched(e: &Evidence, d: &Delivered<'_>, r: &mut Report) {
    r.answered_unmatched += usize::from(d.unmatched_of_late_order(e).is_some());
}

/// The downstream creates each key's effect at most once.
pub(super) fn one_effect_per_key(e: &Evidence, r: &mut Report) {
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
pub(super) fn planned_order(e: &Evidence, c: &Claim) -> Option<i64> {
    e.planned
        .get(&c.event_id)
        .and_then(|(_, o)| *o)
        .filter(|_| event_kind(&c.event_type) != EventKind::Other)
}

/// Claimed `unmatched` before its order existed: the model takes the
/// application (`UPDATE`) instead.
pub(super) fn claimed_before_its_order(e: &Evidence, c: &Claim) -> bool {
    c.op == "INSERT"
        && c.status == "unmatched"
        && planned_order(e, c).is_some_and(|o| e.late_orders.contains_key(&o))
}

/// An event of an existing order is recorded against that order.
pub(super) fn recorded_against_its_planned_order(e: &Evidence, c: &Claim, r: &mut Report) {
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
