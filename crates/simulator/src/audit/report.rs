//! What `simulator audit` reports: the totals and whether every command had
//! exactly one effect ([`super::totals`]), then the per-order rules
//! ([`super::rules`]). One value, printed as a table and written as JSON.

use std::fmt;

use serde::Serialize;

use super::rules::{Finding, PerOrder, Rule};
use super::totals::{ExactlyOnce, Totals};

/// The whole audit. Its JSON has the totals' and the per-order rules'
/// fields at the top level (`deliveries`, `commands`, `downstream`, ...,
/// `findings`, `violations`), and `exactly_once`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    #[serde(flatten)]
    pub totals: Totals,
    pub exactly_once: ExactlyOnce,
    #[serde(flatten)]
    pub per_order: PerOrder,
}

impl Report {
    /// Exactly once in totals, and every per-order rule held.
    pub fn passed(&self) -> bool {
        self.exactly_once.held && self.per_order.passed()
    }

    pub fn finding(&self, rule: Rule) -> &Finding {
        self.per_order.finding(rule)
    }
}

impl fmt::Display for Report {
    /// The table `make run` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let window = match self.per_order.since_secs {
            Some(secs) => format!("events, commands and payments of the last {secs} s"),
            None => "every event, command and payment".to_owned(),
        };
        writeln!(
            f,
            "Audit: the downstream's own records against the database ({window})"
        )?;
        writeln!(f)?;
        writeln!(f, "{}", self.totals)?;
        writeln!(f)?;
        writeln!(
            f,
            "Per order (a shipment may start up to the relay's lease, {} s, after a refund):",
            self.per_order.lease_secs
        )?;
        writeln!(f)?;
        writeln!(f, "{}", self.per_order)?;
        if self.exactly_once.shipments_under_way > 0 {
            writeln!(
                f,
                "  {} shipments of refunded orders made by a call under way before the refund \
                 (the relay saw it fail; its row cancelled): allowed",
                self.exactly_once.shipments_under_way
            )?;
        }
        write!(f, "  {}", self.exactly_once.summary)
    }
}
