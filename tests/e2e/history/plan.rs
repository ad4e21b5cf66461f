//! What the provider sends: each order's events, their duplicates and
//! delays, and when a late order is created; reproducible from a seed.

use super::*;

/// One event the provider sends, and how.
#[derive(Debug, Clone)]
pub(super) struct Planned {
    pub(super) id: String,
    pub(super) event_type: &'static str,
    pub(super) payment_id: String,
    pub(super) order: Option<i64>,
    /// Delay before its first delivery, from the start of its order's group.
    pub(super) delay_ms: u64,
    /// Extra deliveries (duplicates), each after this delay.
    pub(super) duplicates: Vec<u64>,
}

/// When an order is created, if not before the test starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Late {
    /// This long after its group's first send: while its events are in
    /// flight (a few ms), or a second or two later.
    After(u64),
    /// Only after its events aged past retention and the prune ran.
    AfterRetention,
}

/// One order's events, delivered together, and when the order is created
/// when it is not there from the start.
#[derive(Debug, Clone)]
pub(super) struct Group {
    pub(super) events: Vec<Planned>,
    pub(super) create: Option<(i64, Late)>,
}

impl Group {
    pub(super) fn of(events: Vec<Planned>) -> Self {
        Self { events, create: None }
    }
}

pub(super) fn late(rng: &mut StdRng, retention: bool) -> Option<Late> {
    let roll: f64 = rng.random();
    if roll < 0.05 {
        Some(Late::After(rng.random_range(0..30)))
    } else if roll < 0.09 {
        Some(Late::After(rng.random_range(800..2500)))
    } else if retention && roll < 0.11 {
        Some(Late::AfterRetention)
    } else {
        None
    }
}

pub(super) fn plan(
    rng: &mut StdRng,
    orders: i64,
    retained: &HashSet<i64>,
    retention: bool,
) -> (Vec<Group>, Vec<Group>) {
    let mut phase1 = Vec::new();
    let mut phase2 = Vec::new();
    let event =
        |rng: &mut StdRng, id: String, event_type: &'static str, order: Option<i64>, payment_id: String| {
            let mut duplicates = Vec::new();
            for _ in 0..3 {
                if rng.random_bool(0.12) {
                    duplicates.push(if rng.random_bool(0.7) {
                        rng.random_range(0..20)
                    } else {
                        rng.random_range(50..400)
                    });
                }
            }
            Planned {
                id,
                event_type,
                payment_id,
                order,
                delay_ms: if rng.random_bool(0.5) {
                    0
                } else {
                    rng.random_range(0..25)
                },
                duplicates,
            }
        };
    for order in 1..=orders {
        let pay = format!("pay_{order}");
        let mut group = Vec::new();
        let mut kinds: Vec<(&str, &'static str)> = Vec::new();
        if rng.random_bool(0.85) {
            kinds.push(("pay", "payment.succeeded"));
        }
        if rng.random_bool(0.45) {
            kinds.push(("refund", "payment.refunded"));
        }
        if rng.random_bool(0.1) {
            kinds.push(("pay2", "payment.succeeded"));
        }
        if rng.random_bool(0.1) {
            kinds.push(("refund2", "payment.refunded"));
        }
        if rng.random_bool(0.1) {
            kinds.push(("update", "payment.updated"));
        }
        for (tag, event_type) in kinds {
            group.push(event(
                rng,
                format!("evt_{tag}_{order}"),
                event_type,
                Some(order),
                pay.clone(),
            ));
        }
        // Refunds that overtake their payment on purpose.
        if rng.random_bool(0.1) {
            for p in &mut group {
                p.delay_ms = if p.event_type == "payment.refunded" { 0 } else { 15 };
            }
        }
        let create = if retained.contains(&order) {
            None
        } else {
            late(rng, retention).map(|l| (order, l))
        };
        phase1.push(Group {
            events: group,
            create,
        });
        if retained.contains(&order) {
            let mut late = Vec::new();
            // The first refund or payment resent after its record was pruned,
            // and a new distinct refund.
            late.push(event(
                rng,
                format!("evt_refund_{order}"),
                "payment.refunded",
                Some(order),
                pay.clone(),
            ));
            late.push(event(
                rng,
                format!("evt_pay_{order}"),
                "payment.succeeded",
                Some(order),
                pay.clone(),
            ));
            late.push(event(
                rng,
                format!("evt_refund3_{order}"),
                "payment.refunded",
                Some(order),
                pay.clone(),
            ));
            phase2.push(Group::of(late));
        }
    }
    // Payment ids no order has.
    for n in 0..orders / 50 {
        let kind = if n % 2 == 0 {
            "payment.succeeded"
        } else {
            "payment.refunded"
        };
        phase1.push(Group::of(vec![event(
            rng,
            format!("evt_stray_{n}"),
            kind,
            None,
            format!("pay_none_{n}"),
        )]));
    }
    (phase1, phase2)
}

/// Deliveries `groups` plans: each event's first and its duplicates.
pub(super) fn planned_deliveries(groups: &[Group]) -> u64 {
    groups
        .iter()
        .flat_map(|g| &g.events)
        .map(|p| 1 + p.duplicates.len() as u64)
        .sum()
}

/// One run's histories: what the provider sends in each phase.
pub(super) struct Histories {
    /// Every order's events, the stray payments, and the late orders'
    /// creations.
    pub(super) phase1: Vec<Group>,
    /// After retention: resends and new refunds of the retained orders.
    pub(super) phase2: Vec<Group>,
    /// Orders whose rows and events age past retention and are pruned.
    pub(super) retained: HashSet<i64>,
    /// Every event of both phases: id -> (type, order it names).
    pub(super) planned: HashMap<String, (String, Option<i64>)>,
    /// Orders created after their first events were sent.
    pub(super) late: HashSet<i64>,
}

/// The histories of `seed`: a failing seed replays the same histories.
pub(super) fn generate_histories(orders: i64, seed: u64, retention: bool) -> Histories {
    let mut rng = StdRng::seed_from_u64(seed);
    let retained: HashSet<i64> = if retention {
        (1..=orders).filter(|_| rng.random_bool(0.05)).collect()
    } else {
        HashSet::new()
    };
    let (phase1, phase2) = plan(&mut rng, orders, &retained, retention);
    let planned = phase1
        .iter()
        .chain(&phase2)
        .flat_map(|g| &g.events)
        .map(|p| (p.id.clone(), (p.event_type.to_owned(), p.order)))
        .collect();
    let late = phase1.iter().filter_map(|g| g.create.map(|(o, _)| o)).collect();
    Histories {
        phase1,
        phase2,
        retained,
        planned,
        late,
    }
}

impl Histories {
    /// Orders created only after their events aged past retention.
    pub(super) fn created_after_retention(&self) -> Vec<i64> {
        self.phase1
            .iter()
            .filter_map(|g| match g.create {
                Some((order, Late::AfterRetention)) => Some(order),
                _ => None,
            })
            .collect()
    }
}
