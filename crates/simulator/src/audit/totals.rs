//! Exactly once, in totals: the effects the downstream counted against the
//! commands the outbox holds over the audit's window. `make run` ends on its
//! summary: "exactly once: N shipments and M emails for X events and Y
//! deliveries; double effects 0".
//!
//! It holds when, the relay having drained its outbox:
//! - no command is left pending or dead: each was carried out;
//! - the emails made equal the email commands done (nothing cancels an email);
//! - the shipments made lie between the shipment commands done and those plus
//!   the cancelled ones: a shipment whose call was under way when its order's
//!   refund committed may exist with its row cancelled (the call failed at the
//!   relay, the carrier did the work). The per-order rule "shipped by a call
//!   started after refund + lease" checks each such order;
//! - no target (order, API, template) has more than one effect.
//!
//! No I/O here: [`compare`] is tested on hand-made totals.

use std::fmt;

use domain::{CommandKind, OutboxStatus};
use serde::{Serialize, Serializer};

use crate::downstream::Stats;

/// Outbox rows of one kind and status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandCount {
    pub kind: CommandKind,
    pub status: OutboxStatus,
    pub count: i64,
}

impl Serialize for CommandCount {
    /// `["ship_order", "done", 95]`: the column values, as scripts read them.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        (self.kind.as_str(), self.status.as_str(), self.count).serialize(serializer)
    }
}

/// What the downstream itself counted (its `GET /stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DownstreamEffects {
    pub requests: u64,
    pub effects: u64,
    pub shipments: u64,
    pub emails: u64,
    pub double_effects: u64,
}

impl DownstreamEffects {
    pub fn of(stats: &Stats) -> Self {
        let effects_at = |path: &str| stats.by_path.get(path).map_or(0, |p| p.effects);
        Self {
            requests: stats.requests,
            effects: stats.effects,
            shipments: effects_at(CommandKind::ShipOrder.path()),
            emails: effects_at(CommandKind::SendConfirmation.path()),
            double_effects: stats.double_effects,
        }
    }
}

/// The window's events and commands, and the downstream's effects.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Deliveries received for the events first processed in the window.
    pub deliveries: i64,
    pub distinct_events: i64,
    pub duplicate_deliveries: i64,
    /// Events by recorded status (`processed`, `refunded`, `unmatched`, ...).
    pub events_by_status: Vec<(String, i64)>,
    /// Outbox rows created in the window, by kind and status.
    pub commands: Vec<CommandCount>,
    pub downstream: DownstreamEffects,
}

impl Totals {
    /// Rows of `kind` in `status`; `None` for any kind or any status.
    pub fn commands(&self, kind: Option<CommandKind>, status: Option<OutboxStatus>) -> i64 {
        self.commands
            .iter()
            .filter(|c| kind.is_none_or(|k| k == c.kind) && status.is_none_or(|s| s == c.status))
            .map(|c| c.count)
            .sum()
    }
}

/// Whether every command had exactly one effect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExactlyOnce {
    pub held: bool,
    /// What broke it, one phrase each; empty when it held.
    pub problems: Vec<String>,
    /// Shipments made by a call under way before the order's refund (their
    /// rows cancelled): allowed, and counted so the report can say so.
    pub shipments_under_way: u64,
    /// The line `make run` ends on.
    pub summary: String,
}

/// Compares the downstream's effects with the outbox's commands.
pub fn compare(totals: &Totals) -> ExactlyOnce {
    let done = |kind| totals.commands(Some(kind), Some(OutboxStatus::Done)).max(0) as u64;
    let down = &totals.downstream;
    let mut problems = Vec::new();
    if down.double_effects != 0 {
        problems.push(format!(
            "{} double effects at the downstream",
            down.double_effects
        ));
    }
    let pending = totals.commands(None, Some(OutboxStatus::Pending));
    let dead = totals.commands(None, Some(OutboxStatus::Dead));
    if pending != 0 || dead != 0 {
        problems.push(format!("{pending} commands still pending, {dead} dead"));
    }
    let shipped = done(CommandKind::ShipOrder);
    let ship_cancelled = totals
        .commands(Some(CommandKind::ShipOrder), Some(OutboxStatus::Cancelled))
        .max(0) as u64;
    if !(shipped..=shipped + ship_cancelled).contains(&down.shipments) {
        problems.push(format!(
            "shipments at the downstream {} outside ship commands delivered {shipped} .. {shipped} + {ship_cancelled} cancelled",
            down.shipments
        ));
    }
    let emails = done(CommandKind::SendConfirmation) + done(CommandKind::SendRefundNotice);
    if down.emails != emails {
        problems.push(format!(
            "emails at the downstream {} != email commands delivered {emails}",
            down.emails
        ));
    }
    let held = problems.is_empty();
    let summary = if held {
        format!(
            "exactly once: {} shipments and {} emails for {} events and {} deliveries; double effects 0",
            down.shipments, down.emails, totals.distinct_events, totals.deliveries
        )
    } else {
        format!("exactly once: NOT held: {}", problems.join("; "))
    };
    ExactlyOnce {
        held,
        problems,
        shipments_under_way: down.shipments.saturating_sub(shipped),
        summary,
    }
}

impl fmt::Display for Totals {
    /// The events, the commands and the downstream's counts, as a table.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let share = if self.deliveries > 0 {
            format!(
                "{:.1}%",
                100.0 * self.duplicate_deliveries as f64 / self.deliveries as f64
            )
        } else {
            "-".to_owned()
        };
        writeln!(f, "  deliveries received     {:>10}", self.deliveries)?;
        writeln!(f, "  distinct event ids      {:>10}", self.distinct_events)?;
        writeln!(
            f,
            "  duplicate deliveries    {:>10}  ({share} of deliveries)",
            self.duplicate_deliveries
        )?;
        let statuses: Vec<String> = self
            .events_by_status
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect();
        writeln!(f, "  events by status        {}", statuses.join(", "))?;
        writeln!(f)?;
        writeln!(
            f,
            "  {:<20} {:>9} {:>10} {:>8} {:>6} {:>10}",
            "command", "enqueued", "delivered", "pending", "dead", "cancelled"
        )?;
        for kind in CommandKind::ALL {
            let count = |status| self.commands(Some(kind), status);
            writeln!(
                f,
                "  {:<20} {:>9} {:>10} {:>8} {:>6} {:>10}",
                kind.as_str(),
                count(None),
                count(Some(OutboxStatus::Done)),
                count(Some(OutboxStatus::Pending)),
                count(Some(OutboxStatus::Dead)),
                count(Some(OutboxStatus::Cancelled))
            )?;
        }
        let d = &self.downstream;
        writeln!(f)?;
        writeln!(f, "  at the downstream (its own records):")?;
        writeln!(f, "    requests received     {:>10}", d.requests)?;
        writeln!(f, "    shipments created     {:>10}", d.shipments)?;
        writeln!(f, "    emails sent           {:>10}", d.emails)?;
        write!(f, "    double effects        {:>10}", d.double_effects)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(commands: &[(CommandKind, OutboxStatus, i64)], shipments: u64, emails: u64) -> Totals {
        Totals {
            deliveries: 12,
            distinct_events: 10,
            duplicate_deliveries: 2,
            events_by_status: vec![("processed".to_owned(), 10)],
            commands: commands
                .iter()
                .map(|&(kind, status, count)| CommandCount { kind, status, count })
                .collect(),
            downstream: DownstreamEffects {
                shipments,
                emails,
                ..DownstreamEffects::default()
            },
        }
    }

    use CommandKind::{SendConfirmation, SendRefundNotice, ShipOrder};
    use OutboxStatus::{Cancelled, Dead, Done, Pending};

    #[test]
    fn effects_equal_to_commands_done_hold() {
        let held = compare(&totals(
            &[
                (ShipOrder, Done, 9),
                (SendConfirmation, Done, 10),
                (SendRefundNotice, Done, 1),
            ],
            9,
            11,
        ));
        assert!(held.held, "{held:?}");
        assert_eq!(
            held.summary,
            "exactly once: 9 shipments and 11 emails for 10 events and 12 deliveries; double effects 0"
        );
    }

    #[test]
    fn a_shipment_under_way_before_its_refund_is_allowed_up_to_the_cancelled_rows() {
        let commands = [
            (ShipOrder, Done, 9),
            (ShipOrder, Cancelled, 1),
            (SendConfirmation, Done, 10),
        ];
        let allowed = compare(&totals(&commands, 10, 10));
        assert!(allowed.held, "{allowed:?}");
        assert_eq!(allowed.shipments_under_way, 1);
        let beyond = compare(&totals(&commands, 11, 10));
        assert!(!beyond.held);
        assert!(
            beyond.problems[0].contains("outside ship commands delivered 9 .. 9 + 1"),
            "{beyond:?}"
        );
    }

    #[test]
    fn each_break_is_named() {
        let mut broken = totals(
            &[
                (ShipOrder, Done, 9),
                (ShipOrder, Pending, 1),
                (SendConfirmation, Dead, 1),
            ],
            8,
            1,
        );
        broken.downstream.double_effects = 2;
        let report = compare(&broken);
        assert!(!report.held);
        assert_eq!(report.problems.len(), 4, "{:?}", report.problems);
        assert!(
            report
                .summary
                .starts_with("exactly once: NOT held: 2 double effects"),
            "{}",
            report.summary
        );
        assert!(
            report.summary.contains("1 commands still pending, 1 dead"),
            "{}",
            report.summary
        );
        assert!(
            report
                .summary
                .contains("emails at the downstream 1 != email commands delivered 0")
        );
    }

    #[test]
    fn commands_serialise_as_the_columns() {
        let json = serde_json::to_value(totals(&[(ShipOrder, Done, 9)], 9, 0)).unwrap();
        assert_eq!(json["commands"], serde_json::json!([["ship_order", "done", 9]]));
        assert_eq!(json["events_by_status"], serde_json::json!([["processed", 10]]));
        assert_eq!(json["downstream"]["shipments"], 9);
    }
}
