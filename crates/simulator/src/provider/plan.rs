//! What event `n` is and how it will be delivered: its kind and order, its
//! ids and body (built once, sent as often as needed), whether it is
//! duplicated or burst.
//!
//! Each event's draws come from its own generator seeded by the run's seed
//! and `n`, so the mix of a seeded run is the same whatever the concurrency
//! or the order senders pick events in. Refunds are the exception: they
//! refund an order whose payment was acknowledged, which depends on timing.

use std::fmt::Write as _;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use reqwest::header::HeaderValue;

use super::config::{Bursts, Duplicates, Mix};

/// Every event says it is for this amount.
const AMOUNT: u64 = 4200;
const CURRENCY: &str = "gbp";
/// The type of the events the ingest does not act on.
pub(crate) const UNKNOWN_TYPE: &str = "customer.updated";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    /// `payment.succeeded` for a seeded order.
    Payment,
    /// `payment.refunded` for an order already paid in this run.
    Refund,
    /// `payment.succeeded` for a payment id no order has.
    Unmatched,
    /// A type the ingest ignores.
    Unknown,
}

impl EventKind {
    pub(crate) fn type_name(self) -> &'static str {
        match self {
            Self::Payment | Self::Unmatched => "payment.succeeded",
            Self::Refund => "payment.refunded",
            Self::Unknown => UNKNOWN_TYPE,
        }
    }
}

/// One event, ready to send as often as needed.
#[derive(Debug)]
pub(crate) struct Event {
    /// `evt_<run>_<n>`: the ingest's dedup key.
    pub id: String,
    pub kind: EventKind,
    /// The seeded order a payment or refund is for.
    pub order: Option<u64>,
    pub payment_id: String,
    /// `msg_<run>_<n>`: the Standard Webhooks `webhook-id`, the same on
    /// every delivery of the event, as the standard requires.
    pub webhook_id: HeaderValue,
    /// The JSON body, shared by every delivery (a `Bytes` clone is a
    /// reference count, not a copy).
    pub body: Bytes,
}

/// Event `n` and the deliveries it gets besides the first.
#[derive(Debug)]
pub(crate) struct Plan {
    pub event: Event,
    /// The first delivery is a burst of [`Bursts::size`] concurrent ones.
    pub burst: bool,
    pub duplicate: Option<Duplicate>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Duplicate {
    /// After the first delivery's start.
    pub delay: Duration,
    /// Held back to the late phase.
    pub late: bool,
}

/// Makes the events of a run.
pub(crate) struct Planner {
    run_id: String,
    seed: u64,
    mix: Mix,
    duplicates: Duplicates,
    bursts: Bursts,
    /// Orders whose payment was acknowledged as `processed` and not yet
    /// refunded: what a refund may pick from.
    paid: Mutex<Vec<u64>>,
}

impl Planner {
    pub(crate) fn new(run_id: String, seed: u64, mix: Mix, duplicates: Duplicates, bursts: Bursts) -> Self {
        Self {
            run_id,
            seed,
            mix,
            duplicates,
            bursts,
            paid: Mutex::new(Vec::new()),
        }
    }

    /// Event `n` (from 1).
    pub(crate) fn plan(&self, n: u64) -> Plan {
        // Distinct, well-mixed seeds per event (`seed_from_u64` scrambles too).
        let mut rng = SmallRng::seed_from_u64(self.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let kind = self.draw_kind(&mut rng);
        let (kind, order) = match kind {
            EventKind::Refund => match self.take_paid(&mut rng) {
                Some(order) => (EventKind::Refund, Some(order)),
                None => (EventKind::Payment, Some(self.order_of(n))),
            },
            EventKind::Payment | EventKind::Unknown => (kind, Some(self.order_of(n))),
            EventKind::Unmatched => (kind, None),
        };
        let burst = rng.random_bool(self.bursts.rate);
        let duplicate = rng.random_bool(self.duplicates.rate).then(|| Duplicate {
            delay: self.duplicates.delay.sample(&mut rng),
            late: rng.random_bool(self.duplicates.late_rate),
        });
        Plan {
            event: self.event(n, kind, order),
            burst,
            duplicate,
        }
    }

    /// A payment of `order` was processed: it may be refunded from now on.
    pub(crate) fn paid(&self, order: u64) {
        self.paid
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(order);
    }

    fn draw_kind(&self, rng: &mut SmallRng) -> EventKind {
        let mut u: f64 = rng.random();
        for (rate, kind) in [
            (self.mix.unknown_rate, EventKind::Unknown),
            (self.mix.unmatched_rate, EventKind::Unmatched),
            (self.mix.refund_rate, EventKind::Refund),
        ] {
            if u < rate {
                return kind;
            }
            u -= rate;
        }
        EventKind::Payment
    }

    /// A random paid order, refunded at most once.
    fn take_paid(&self, rng: &mut SmallRng) -> Option<u64> {
        let mut paid = self.paid.lock().unwrap_or_else(PoisonError::into_inner);
        if paid.is_empty() {
            return None;
        }
        let i = rng.random_range(0..paid.len());
        Some(paid.swap_remove(i))
    }

    /// Event `n` pays the `n`th order from the first, wrapping past the last.
    fn order_of(&self, n: u64) -> u64 {
        self.mix.first_order + (n - 1) % self.mix.orders
    }

    fn event(&self, n: u64, kind: EventKind, order: Option<u64>) -> Event {
        let run = &self.run_id;
        let id = format!("evt_{run}_{n}");
        let payment_id = match order {
            Some(order) => format!("pay_{order}"),
            None => format!("pay_x{run}_{n}"),
        };
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // Every piece is ASCII without quotes or backslashes (the run id is
        // validated), so formatting is exact JSON and cheaper than serde.
        let mut body = String::with_capacity(160);
        let _ = write!(
            body,
            r#"{{"id":"{id}","type":"{}","created":{created},"data":{{"payment_id":"{payment_id}","amount":{AMOUNT},"currency":"{CURRENCY}"}}}}"#,
            kind.type_name()
        );
        let webhook_id =
            HeaderValue::try_from(format!("msg_{run}_{n}")).expect("run ids are validated header-safe ASCII");
        Event {
            id,
            kind,
            order,
            payment_id,
            webhook_id,
            body: Bytes::from(body),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::config::DelayRange;

    fn planner(mix: Mix, duplicates: Duplicates, bursts: Bursts) -> Planner {
        Planner::new("r1".into(), 7, mix, duplicates, bursts)
    }

    #[test]
    fn payments_pay_one_order_each_and_wrap() {
        let p = planner(
            Mix {
                orders: 3,
                ..Mix::default()
            },
            Duplicates::default(),
            Bursts::default(),
        );
        let orders: Vec<_> = (1..=7).map(|n| p.plan(n).event.payment_id).collect();
        assert_eq!(
            orders,
            ["pay_1", "pay_2", "pay_3", "pay_1", "pay_2", "pay_3", "pay_1"]
        );
        let plan = p.plan(5);
        assert!(!plan.burst && plan.duplicate.is_none());
        let body: serde_json::Value = serde_json::from_slice(&plan.event.body).unwrap();
        assert_eq!(body["id"], "evt_r1_5");
        assert_eq!(body["type"], "payment.succeeded");
        assert_eq!(body["data"]["payment_id"], "pay_2");
        assert_eq!(body["data"]["amount"], 4200);
        assert_eq!(body["data"]["currency"], "gbp");
        assert!(body["created"].as_u64().unwrap() > 1_700_000_000);
        assert_eq!(plan.event.webhook_id, "msg_r1_5");

        let moved = planner(
            Mix {
                orders: 3,
                first_order: 101,
                ..Mix::default()
            },
            Duplicates::default(),
            Bursts::default(),
        );
        let orders: Vec<_> = (1..=4).map(|n| moved.plan(n).event.payment_id).collect();
        assert_eq!(orders, ["pay_101", "pay_102", "pay_103", "pay_101"]);
    }

    #[test]
    fn the_mix_follows_the_rates_and_is_repeatable() {
        let mix = Mix {
            orders: 100_000,
            refund_rate: 0.2,
            unknown_rate: 0.1,
            unmatched_rate: 0.1,
            ..Mix::default()
        };
        let duplicates = Duplicates {
            rate: 0.5,
            late_rate: 0.5,
            delay: DelayRange { min_ms: 5, max_ms: 9 },
            ..Duplicates::default()
        };
        let bursts = Bursts { rate: 0.25, size: 3 };
        let p = planner(mix, duplicates, bursts);
        // Everything is paid up front, so no refund falls back to a payment.
        for order in 1..=10_000 {
            p.paid(order);
        }
        let mut counts = [0u32; 4];
        let (mut dups, mut late, mut burst) = (0, 0, 0);
        for n in 1..=10_000 {
            let plan = p.plan(n);
            counts[plan.event.kind as usize] += 1;
            match plan.event.kind {
                EventKind::Unmatched => assert_eq!(plan.event.payment_id, format!("pay_xr1_{n}")),
                EventKind::Refund => assert!(plan.event.order.unwrap() <= 10_000),
                _ => assert_eq!(plan.event.order, Some(n)),
            }
            if let Some(d) = plan.duplicate {
                dups += 1;
                late += u32::from(d.late);
                assert!((5..=9).contains(&d.delay.as_millis()));
            }
            burst += u32::from(plan.burst);
        }
        let share = |n: u32| f64::from(n) / 10_000.0;
        let [payment, refund, unmatched, unknown] = counts.map(share);
        assert!((payment - 0.6).abs() < 0.03, "{counts:?}");
        assert!((refund - 0.2).abs() < 0.03, "{counts:?}");
        assert!((unmatched - 0.1).abs() < 0.02, "{counts:?}");
        assert!((unknown - 0.1).abs() < 0.02, "{counts:?}");
        assert!((share(dups) - 0.5).abs() < 0.03 && (share(late) - 0.25).abs() < 0.03);
        assert!((share(burst) - 0.25).abs() < 0.03);

        let again = planner(mix, duplicates, bursts);
        let first = planner(mix, duplicates, bursts);
        for n in 1..=100 {
            let (a, b) = (first.plan(n), again.plan(n));
            assert_eq!(
                (a.event.body.len(), a.burst, a.duplicate),
                (b.event.body.len(), b.burst, b.duplicate)
            );
        }
    }

    #[test]
    fn refunds_need_a_paid_order_and_take_each_once() {
        let p = planner(
            Mix {
                refund_rate: 1.0,
                ..Mix::default()
            },
            Duplicates::default(),
            Bursts::default(),
        );
        let first = p.plan(1);
        assert_eq!(first.event.kind, EventKind::Payment, "nothing paid yet");
        p.paid(1);
        let refund = p.plan(2);
        assert_eq!(
            (refund.event.kind, refund.event.order),
            (EventKind::Refund, Some(1))
        );
        assert!(
            refund
                .event
                .body
                .starts_with(br#"{"id":"evt_r1_2","type":"payment.refunded""#)
        );
        assert_eq!(
            p.plan(3).event.kind,
            EventKind::Payment,
            "order 1 is refunded already"
        );
    }
}
