//! The per-order rules, checked in memory: what the database says happened
//! to each order ([`Ledger`]) against what the downstream did ([`Stats`]).
//! No I/O here, so every rule is tested on hand-made inputs.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::time::Duration;

use domain::{CommandKind, OrderStatus};
use serde::Serialize;

use crate::downstream::{KeyStats, Stats, TargetEffects};

/// Order ids listed per rule: enough to start debugging from, short enough
/// for a terminal.
pub const MAX_EXAMPLES: usize = 10;

/// What the database says about the orders the rules look at.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    /// Orders with a `payment.succeeded` event whose status is `processed`.
    pub paid: HashMap<i64, Payment>,
    /// Orders with a `payment.refunded` event whose status is `refunded`:
    /// when the first one was processed, in unix microseconds.
    pub refunded_at_us: HashMap<i64, u64>,
    /// The status of every order the downstream sent a refund notice for
    /// (absent: no such order).
    pub statuses: HashMap<i64, OrderStatus>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Payment {
    /// Whether the order was paid within the audit's window (always, without
    /// one): only such orders are expected to have their confirmation at a
    /// downstream that may have started after older payments.
    pub in_window: bool,
}

/// One rule of the product's promise per order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// A shipment for an order with no processed payment.
    ShippedUnpaid,
    /// A refunded order shipped by a call that arrived after its refund
    /// committed plus the relay's lease: no claim made before the refund
    /// can explain it.
    ShippedAfterRefund,
    /// More than one refund notice for one order.
    RefundNoticeTwice,
    /// A refund notice for an order that is not refunded.
    RefundNoticeUnrefunded,
    /// A paid order without its confirmation.
    PaidUnconfirmed,
    /// Any target (order, path, template) with more than one effect.
    DoubleEffects,
}

impl Rule {
    pub const ALL: [Rule; 6] = [
        Self::ShippedUnpaid,
        Self::ShippedAfterRefund,
        Self::RefundNoticeTwice,
        Self::RefundNoticeUnrefunded,
        Self::PaidUnconfirmed,
        Self::DoubleEffects,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Self::ShippedUnpaid => "shipments of orders never paid",
            Self::ShippedAfterRefund => "refunded orders shipped by a call started after refund + lease",
            Self::RefundNoticeTwice => "orders with more than one refund notice",
            Self::RefundNoticeUnrefunded => "refund notices for orders not refunded",
            Self::PaidUnconfirmed => "paid orders without a confirmation",
            Self::DoubleEffects => "double effects (targets with more than one)",
        }
    }
}

/// One rule's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub rule: Rule,
    pub title: &'static str,
    /// Orders breaking the rule; for double effects, targets (the
    /// downstream's own count).
    pub count: u64,
    /// The first [`MAX_EXAMPLES`] order ids, smallest first.
    pub examples: Vec<i64>,
}

/// Every rule, in [`Rule::ALL`] order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PerOrder {
    pub lease_secs: u64,
    /// Seconds back from the database's clock that paid orders were
    /// checked for a confirmation; `None`: every paid order.
    pub since_secs: Option<u64>,
    pub findings: Vec<Finding>,
    /// The sum of the counts: 0 when the promise held.
    pub violations: u64,
}

impl PerOrder {
    pub fn passed(&self) -> bool {
        self.violations == 0
    }

    pub fn finding(&self, rule: Rule) -> &Finding {
        self.findings
            .iter()
            .find(|f| f.rule == rule)
            .expect("every rule is reported")
    }
}

/// A target's effects, decoded: which command made them.
fn command_of(target: &TargetEffects) -> Result<CommandKind, String> {
    match (target.path.as_str(), target.template.as_deref()) {
        ("/shipments", None) => Ok(CommandKind::ShipOrder),
        ("/emails", Some("order_confirmation")) => Ok(CommandKind::SendConfirmation),
        ("/emails", Some("refund_notice")) => Ok(CommandKind::SendRefundNotice),
        (path, template) => Err(format!("unknown downstream target {path} {template:?}")),
    }
}

/// Effects per order and command, from the downstream's per-target counts.
pub fn effects_by_order(stats: &Stats) -> Result<HashMap<(i64, CommandKind), u64>, String> {
    let mut effects = HashMap::new();
    for target in &stats.targets {
        *effects.entry((target.order_id, command_of(target)?)).or_default() += target.effects;
    }
    Ok(effects)
}

/// When the call that created the key's effect arrived, in unix
/// microseconds (the latest, if several did). An effect made by a call past
/// the recorded ones ([`crate::downstream::stats::MAX_STATUSES`]) is dated
/// by when the effect was made instead: no earlier than its call's arrival,
/// so the check can only be stricter for it.
fn effect_call_arrived_us(key: &KeyStats) -> Option<u64> {
    let recorded = key.calls.iter().filter(|c| c.effect).map(|c| c.arrived_us).max();
    let recorded_all = key.calls.iter().filter(|c| c.effect).count() as u64 >= key.effects;
    match (recorded, key.effect_at_ms) {
        (Some(arrived), _) if recorded_all => Some(arrived),
        (recorded, Some(effect_ms)) => Some(recorded.unwrap_or(0).max(effect_ms * 1000)),
        (recorded, None) => recorded,
    }
}

/// Checks every rule. `stats` must have been taken with keys (`GET /stats`).
pub fn check(
    ledger: &Ledger,
    stats: &Stats,
    lease: Duration,
    since: Option<Duration>,
) -> Result<PerOrder, String> {
    let keys = stats
        .keys
        .as_ref()
        .ok_or("the downstream's stats have no keys (taken with ?keys=false)")?;
    let effects = effects_by_order(stats)?;
    let effects_of = |order: i64, kind: CommandKind| effects.get(&(order, kind)).copied().unwrap_or(0);
    let lease_us = lease.as_micros() as u64;

    let mut broken: HashMap<Rule, BTreeSet<i64>> = HashMap::new();
    let mut flag = |rule: Rule, order: i64| {
        broken.entry(rule).or_default().insert(order);
    };
    for (&(order, kind), &n) in &effects {
        match kind {
            CommandKind::ShipOrder if n > 0 && !ledger.paid.contains_key(&order) => {
                flag(Rule::ShippedUnpaid, order);
            }
            CommandKind::SendRefundNotice => {
                if n > 1 {
                    flag(Rule::RefundNoticeTwice, order);
                }
                if n > 0 && ledger.statuses.get(&order) != Some(&OrderStatus::Refunded) {
                    flag(Rule::RefundNoticeUnrefunded, order);
                }
            }
            _ => {}
        }
    }
    for (&order, &refunded_us) in &ledger.refunded_at_us {
        let key = CommandKind::ShipOrder.idempotency_key(order);
        let arrived = keys.get(&key).and_then(effect_call_arrived_us);
        if arrived.is_some_and(|arrived| arrived > refunded_us + lease_us) {
            flag(Rule::ShippedAfterRefund, order);
        }
    }
    for (&order, payment) in &ledger.paid {
        if payment.in_window && effects_of(order, CommandKind::SendConfirmation) == 0 {
            flag(Rule::PaidUnconfirmed, order);
        }
    }

    let findings = Rule::ALL
        .into_iter()
        .map(|rule| {
            let (count, examples) = match rule {
                Rule::DoubleEffects => {
                    let orders: BTreeSet<i64> =
                        stats.double_effect_targets.iter().map(|t| t.order_id).collect();
                    (stats.double_effects, orders.into_iter().collect())
                }
                _ => {
                    let orders = broken.remove(&rule).unwrap_or_default();
                    (orders.len() as u64, orders.into_iter().collect::<Vec<_>>())
                }
            };
            Finding {
                rule,
                title: rule.title(),
                count,
                examples: examples.into_iter().take(MAX_EXAMPLES).collect(),
            }
        })
        .collect::<Vec<_>>();
    Ok(PerOrder {
        lease_secs: lease.as_secs(),
        since_secs: since.map(|s| s.as_secs()),
        violations: findings.iter().map(|f| f.count).sum(),
        findings,
    })
}

impl fmt::Display for PerOrder {
    /// The table of rules, with a count and example orders each.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "  {:<66} {:>6}  examples (order ids)", "rule", "count")?;
        for finding in &self.findings {
            let row = format!("  {:<66} {:>6}", finding.title, finding.count);
            if finding.examples.is_empty() {
                writeln!(f, "{row}")?;
            } else {
                let examples: Vec<String> = finding.examples.iter().map(i64::to_string).collect();
                writeln!(f, "{row}  {}", examples.join(" "))?;
            }
        }
        writeln!(f)?;
        if self.passed() {
            write!(f, "  per-order rules: all held")
        } else {
            write!(f, "  per-order rules: {} violations", self.violations)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::downstream::CallRecord;

    const LEASE: Duration = Duration::from_secs(60);
    const SEC: u64 = 1_000_000;

    fn target(order_id: i64, kind: CommandKind, effects: u64) -> TargetEffects {
        let template = match kind {
            CommandKind::ShipOrder => None,
            CommandKind::SendConfirmation => Some("order_confirmation".to_owned()),
            CommandKind::SendRefundNotice => Some("refund_notice".to_owned()),
        };
        TargetEffects {
            path: kind.path().to_owned(),
            order_id,
            template,
            effects,
        }
    }

    fn shipped_at(arrived_us: u64) -> KeyStats {
        KeyStats {
            requests: 1,
            effects: 1,
            effect_at_ms: Some(arrived_us / 1000 + 5),
            calls: vec![CallRecord {
                arrived_us,
                ended_us: arrived_us + 10,
                status: 201,
                effect: true,
                hung: false,
            }],
            ..KeyStats::default()
        }
    }

    fn stats(targets: Vec<TargetEffects>, keys: BTreeMap<String, KeyStats>) -> Stats {
        Stats {
            targets,
            keys: Some(keys),
            ..Stats::default()
        }
    }

    fn paid(orders: &[i64]) -> HashMap<i64, Payment> {
        orders.iter().map(|&o| (o, Payment { in_window: true })).collect()
    }

    #[test]
    fn a_clean_history_passes() {
        let ledger = Ledger {
            paid: paid(&[1, 2]),
            refunded_at_us: [(2, 100 * SEC)].into(),
            statuses: [(2, OrderStatus::Refunded)].into(),
        };
        let stats = stats(
            vec![
                target(1, CommandKind::ShipOrder, 1),
                target(1, CommandKind::SendConfirmation, 1),
                target(2, CommandKind::ShipOrder, 1),
                target(2, CommandKind::SendConfirmation, 1),
                target(2, CommandKind::SendRefundNotice, 1),
            ],
            // Arrived within the lease after the refund: claimed before it.
            [("ship-2".to_owned(), shipped_at(130 * SEC))].into(),
        );
        let report = check(&ledger, &stats, LEASE, None).unwrap();
        assert!(report.passed(), "{report}");
        assert_eq!(report.findings.len(), Rule::ALL.len());
    }

    #[test]
    fn each_rule_names_its_orders() {
        let ledger = Ledger {
            paid: paid(&[2, 3, 4, 5]),
            refunded_at_us: [(2, 100 * SEC), (3, 100 * SEC)].into(),
            statuses: [(3, OrderStatus::Refunded), (4, OrderStatus::Paid)].into(),
        };
        let stats = stats(
            vec![
                target(1, CommandKind::ShipOrder, 1),
                target(2, CommandKind::ShipOrder, 1),
                target(2, CommandKind::SendConfirmation, 1),
                target(3, CommandKind::SendConfirmation, 1),
                target(3, CommandKind::SendRefundNotice, 2),
                target(4, CommandKind::SendConfirmation, 1),
                target(4, CommandKind::SendRefundNotice, 1),
            ],
            [("ship-2".to_owned(), shipped_at(161 * SEC))].into(),
        );
        let report = check(&ledger, &stats, LEASE, None).unwrap();
        let orders = |rule| report.finding(rule).examples.clone();
        assert_eq!(orders(Rule::ShippedUnpaid), [1]);
        assert_eq!(orders(Rule::ShippedAfterRefund), [2]);
        assert_eq!(orders(Rule::RefundNoticeTwice), [3]);
        assert_eq!(orders(Rule::RefundNoticeUnrefunded), [4]);
        assert_eq!(orders(Rule::PaidUnconfirmed), [5]);
        assert_eq!(report.violations, 5);
        assert!(report.to_string().contains("5 violations"), "{report}");
    }

    #[test]
    fn a_payment_outside_the_window_needs_no_confirmation_here() {
        let ledger = Ledger {
            paid: [(1, Payment { in_window: false })].into(),
            ..Ledger::default()
        };
        let report = check(&ledger, &stats(vec![], BTreeMap::new()), LEASE, None).unwrap();
        assert!(report.passed(), "{report}");
    }

    #[test]
    fn an_effect_past_the_recorded_calls_is_dated_by_the_effect() {
        let mut key = shipped_at(120 * SEC);
        key.calls[0].effect = false;
        key.effect_at_ms = Some(200_000);
        assert_eq!(effect_call_arrived_us(&key), Some(200 * SEC));
        key.effect_at_ms = None;
        assert_eq!(effect_call_arrived_us(&key), None);
    }

    #[test]
    fn examples_are_bounded_and_counts_are_not() {
        let ledger = Ledger {
            paid: paid(&(1..=25).collect::<Vec<_>>()),
            ..Ledger::default()
        };
        let report = check(&ledger, &stats(vec![], BTreeMap::new()), LEASE, None).unwrap();
        let finding = report.finding(Rule::PaidUnconfirmed);
        assert_eq!(finding.count, 25);
        assert_eq!(finding.examples, (1..=10).collect::<Vec<_>>());
    }

    #[test]
    fn stats_without_keys_or_with_an_unknown_target_are_refused() {
        let no_keys = Stats::default();
        assert!(check(&Ledger::default(), &no_keys, LEASE, None).is_err());
        let mut odd = target(1, CommandKind::SendConfirmation, 1);
        odd.template = Some("birthday".to_owned());
        assert!(
            check(
                &Ledger::default(),
                &stats(vec![odd], BTreeMap::new()),
                LEASE,
                None
            )
            .is_err()
        );
    }
}
