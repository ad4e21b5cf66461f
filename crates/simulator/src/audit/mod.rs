//! `simulator audit`: the product's promise checked per ORDER, from the
//! downstream's own records against the database, after a run.
//!
//! The promise: an order is shipped at most once, never after its refund
//! unless that shipment call was already under way (claimed by a relay) when
//! the refund committed, gets one confirmation when paid, and at most one
//! refund notice ever, and every command in the outbox has exactly one
//! effect at the downstream. [`totals`] compares the counts; [`rules`] names
//! the orders that break a rule ([`rules::Rule`]).
//!
//! The downstream is read first, the database second: every effect seen was
//! caused by rows already committed, so an order still being processed
//! cannot look shipped without its payment. "Paid without a confirmation"
//! expects the relay to have drained its outbox (`make run` waits for it).
//!
//! # Layout
//! - [`totals`]: effects against commands, in totals, and their table.
//! - [`rules`]: the per-order rules over in-memory inputs, and their table.
//! - [`report`]: both, as one [`Report`].
//! - here: reading the downstream and the database; one `.sql` file per
//!   statement beside this one.

pub mod report;
pub mod rules;
pub mod totals;

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context as _;
use db::{Column, Sql, col};
use domain::{CommandKind, EventKind, OrderStatus};
use reqwest::Url;
use tokio_postgres::types::Type;

use crate::downstream::Stats;
pub use report::Report;
pub use rules::{Finding, Ledger, Payment, PerOrder, Rule};
pub use totals::{CommandCount, DownstreamEffects, ExactlyOnce, Totals};

/// What to audit, and how.
#[derive(Debug, Clone)]
pub struct AuditConfig {
    pub database: db::Database,
    /// The downstream's base URL (`GET /stats` is read with its keys).
    pub downstream: Url,
    /// The relay's lease: a shipment call that arrived within it after a
    /// refund may have been claimed before the refund, and may succeed.
    pub lease: Duration,
    /// Only payments this recent need their confirmation at this downstream
    /// (a database reused across runs holds older ones); `None`: all.
    pub since: Option<Duration>,
}

/// Per order, its first processed payment and first refund (`$1`: the
/// window in seconds, NULL for none).
pub const PAYMENTS: Sql = Sql::new(
    "simulator/audit/events.sql",
    include_str!("events.sql"),
    &[Type::FLOAT8],
)
.returning(PAYMENT_COLUMNS);
// Column lists are consts of their own: a `Type` has a destructor, so a
// temporary array inside the call cannot be promoted to `'static`.
const PAYMENT_COLUMNS: &[Column] = &[
    col("order_id", Type::INT8),
    col("event_type", Type::TEXT),
    col("first_processed_us", Type::INT8),
    col("in_window", Type::BOOL),
];

/// The status of the orders in `$1`.
pub const ORDER_STATUSES: Sql = Sql::new(
    "simulator/audit/orders.sql",
    include_str!("orders.sql"),
    &[Type::INT8_ARRAY],
)
.returning(STATUS_COLUMNS);
const STATUS_COLUMNS: &[Column] = &[col("id", Type::INT8), col("status", Type::TEXT)];

/// Events first processed in the window, by status, with their deliveries.
pub const EVENTS_BY_STATUS: Sql = Sql::new(
    "simulator/audit/events_by_status.sql",
    include_str!("events_by_status.sql"),
    &[Type::FLOAT8],
)
.returning(EVENTS_BY_STATUS_COLUMNS);
const EVENTS_BY_STATUS_COLUMNS: &[Column] = &[
    col("status", Type::TEXT),
    col("events", Type::INT8),
    col("deliveries", Type::INT8),
];

/// Outbox rows created in the window, by kind and status.
pub const COMMANDS: Sql = Sql::new(
    "simulator/audit/commands.sql",
    include_str!("commands.sql"),
    &[Type::FLOAT8],
)
.returning(COMMAND_COLUMNS);
const COMMAND_COLUMNS: &[Column] = &[
    col("kind", Type::TEXT),
    col("status", Type::TEXT),
    col("commands", Type::INT8),
];

/// Every statement the audit runs, for the workspace's test that prepares
/// each one against the migrated schema.
pub const STATEMENTS: &[&Sql] = &[&PAYMENTS, &ORDER_STATUSES, &EVENTS_BY_STATUS, &COMMANDS];

/// How long the downstream may take to serialise its stats: with keys, a run
/// over 50,000 orders is tens of MB.
const STATS_TIMEOUT: Duration = Duration::from_secs(120);

/// Reads the downstream, then the database; compares the totals and checks
/// every per-order rule.
pub async fn run(config: &AuditConfig) -> anyhow::Result<Report> {
    let stats = fetch_stats(&config.downstream).await?;
    let client = config
        .database
        .connect("simulator-audit")
        .await
        .context("connecting to the database")?;
    let refund_notices: Vec<i64> = rules::effects_by_order(&stats)
        .map_err(anyhow::Error::msg)?
        .into_iter()
        .filter(|((_, kind), n)| *kind == CommandKind::SendRefundNotice && *n > 0)
        .map(|((order, _), _)| order)
        .collect();
    let ledger = read_ledger(&client, &refund_notices, config.since).await?;
    let per_order = rules::check(&ledger, &stats, config.lease, config.since).map_err(anyhow::Error::msg)?;
    let totals = read_totals(&client, &stats, config.since).await?;
    Ok(Report {
        exactly_once: totals::compare(&totals),
        totals,
        per_order,
    })
}

/// The window's events and commands from the database, beside the
/// downstream's effects.
pub async fn read_totals(
    client: &tokio_postgres::Client,
    stats: &Stats,
    since: Option<Duration>,
) -> anyhow::Result<Totals> {
    let since_secs = since.map(|s| s.as_secs_f64());
    let mut totals = Totals {
        downstream: DownstreamEffects::of(stats),
        ..Totals::default()
    };
    let events = EVENTS_BY_STATUS
        .query(client, &[&since_secs])
        .await
        .context("counting processed_events")?;
    for row in events {
        let status: String = row.try_get("status")?;
        let (events, deliveries): (i64, i64) = (row.try_get("events")?, row.try_get("deliveries")?);
        totals.distinct_events += events;
        totals.deliveries += deliveries;
        totals.events_by_status.push((status, events));
    }
    totals.duplicate_deliveries = totals.deliveries - totals.distinct_events;
    let commands = COMMANDS
        .query(client, &[&since_secs])
        .await
        .context("counting outbox rows")?;
    totals.commands = commands
        .into_iter()
        .map(|row| {
            let kind: String = row.try_get("kind")?;
            let status: String = row.try_get("status")?;
            Ok(CommandCount {
                kind: CommandKind::parse(&kind).with_context(|| format!("an outbox row of kind {kind:?}"))?,
                status: domain::OutboxStatus::parse(&status)
                    .with_context(|| format!("an outbox row in status {status:?}"))?,
                count: row.try_get("commands")?,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(totals)
}

/// `GET /stats`, keys included, into the downstream's own type.
pub async fn fetch_stats(base: &Url) -> anyhow::Result<Stats> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = base.join("/stats").context("the downstream's URL")?;
    reqwest::Client::new()
        .get(url.clone())
        .timeout(STATS_TIMEOUT)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("GET {url}"))?
        .json()
        .await
        .with_context(|| format!("reading {url}"))
}

/// The orders' payments and refunds, and the status of the orders in
/// `statuses_of`.
pub async fn read_ledger(
    client: &tokio_postgres::Client,
    statuses_of: &[i64],
    since: Option<Duration>,
) -> anyhow::Result<Ledger> {
    let mut ledger = Ledger::default();
    let since_secs = since.map(|s| s.as_secs_f64());
    let events = PAYMENTS
        .query(client, &[&since_secs])
        .await
        .context("reading processed_events")?;
    for row in events {
        let order: i64 = row.try_get("order_id")?;
        let event_type: String = row.try_get("event_type")?;
        let first_us: i64 = row.try_get("first_processed_us")?;
        let in_window: bool = row.try_get("in_window")?;
        match EventKind::from_type(&event_type) {
            EventKind::PaymentSucceeded => {
                ledger.paid.insert(order, Payment { in_window });
            }
            EventKind::PaymentRefunded => {
                ledger
                    .refunded_at_us
                    .insert(order, u64::try_from(first_us).unwrap_or(0));
            }
            EventKind::Other => anyhow::bail!("events.sql returned a {event_type:?} event"),
        }
    }
    let orders = ORDER_STATUSES
        .query(client, &[&statuses_of])
        .await
        .context("reading orders")?;
    ledger.statuses = orders
        .into_iter()
        .map(|row| {
            let id: i64 = row.try_get("id")?;
            let status: String = row.try_get("status")?;
            let status = OrderStatus::parse(&status)
                .with_context(|| format!("order {id} has an unknown status {status:?}"))?;
            Ok((id, status))
        })
        .collect::<anyhow::Result<HashMap<_, _>>>()?;
    Ok(ledger)
}
