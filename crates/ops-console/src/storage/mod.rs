//! The console's own SQL: what no service's statement reads for it (an
//! order by id or payment id; the unmatched payments with the order each
//! has now). Everything else it runs is the services' own statements, with
//! their guards: `webhook_ingest::storage` and `webhook_ingest::settle`,
//! `outbox_relay::storage`.

use db::{Column, Executor, Sql, col};
use time::OffsetDateTime;
use tokio_postgres::types::Type;

pub(crate) const FIND_ORDER: Sql = Sql::new(
    "ops-console/find_order.sql",
    include_str!("find_order.sql"),
    &[Type::INT8, Type::TEXT],
)
.returning(ORDER_COLUMNS);

const ORDER_COLUMNS: &[Column] = &[
    col("id", Type::INT8),
    col("payment_id", Type::TEXT),
    col("status", Type::TEXT),
    col("created_at", Type::TIMESTAMPTZ),
    col("updated_at", Type::TIMESTAMPTZ),
];

pub(crate) const UNMATCHED_PAGE: Sql = Sql::new(
    "ops-console/unmatched_page.sql",
    include_str!("unmatched_page.sql"),
    &[Type::TIMESTAMPTZ, Type::TEXT, Type::INT8, Type::TEXT],
)
.returning(UNMATCHED_COLUMNS);

const UNMATCHED_COLUMNS: &[Column] = &[
    col("event_id", Type::TEXT),
    col("event_type", Type::TEXT),
    col("processed_at", Type::TIMESTAMPTZ),
    col("deliveries", Type::INT4),
    col("payment_id", Type::TEXT),
    col("order_id", Type::INT8),
    col("age_seconds", Type::FLOAT8),
];

/// Every statement the console runs of its own, for the tests that prepare
/// and plan each against the migrated schema as the console's role.
pub const STATEMENTS: &[&Sql] = &[&FIND_ORDER, &UNMATCHED_PAGE];

/// An order, as the shop wrote it and the ingest changed it.
#[derive(Debug, Clone)]
pub struct Order {
    pub id: i64,
    pub payment_id: Option<String>,
    pub status: String,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
}

/// The orders with id `id` or payment id `payment_id` (at most one each).
pub async fn find_orders(
    client: &(impl Executor + ?Sized),
    id: Option<i64>,
    payment_id: Option<&str>,
) -> Result<Vec<Order>, tokio_postgres::Error> {
    FIND_ORDER
        .query(client, &[&id, &payment_id])
        .await?
        .iter()
        .map(|r| {
            Ok(Order {
                id: r.try_get("id")?,
                payment_id: r.try_get("payment_id")?,
                status: r.try_get("status")?,
                created_at: r.try_get("created_at")?,
                updated_at: r.try_get("updated_at")?,
            })
        })
        .collect()
}

/// A payment no order matched when it arrived.
#[derive(Debug, Clone)]
pub struct Unmatched {
    pub event_id: String,
    pub event_type: String,
    pub processed_at: OffsetDateTime,
    pub deliveries: i32,
    pub payment_id: Option<String>,
    /// The order that has its payment id now, if one does.
    pub order_id: Option<i64>,
    pub age_seconds: f64,
}

/// Which unmatched payments a page shows.
#[derive(Debug, Clone, Default)]
pub struct UnmatchedFilter {
    /// The last row of the previous page: its first delivery and event id.
    pub after: Option<(OffsetDateTime, String)>,
    pub payment_id: Option<String>,
    pub limit: i64,
}

pub async fn unmatched_page(
    client: &(impl Executor + ?Sized),
    filter: &UnmatchedFilter,
) -> Result<Vec<Unmatched>, tokio_postgres::Error> {
    let (after_at, after_id) = match &filter.after {
        Some((at, id)) => (Some(*at), Some(id.as_str())),
        None => (None, None),
    };
    UNMATCHED_PAGE
        .query(client, &[&after_at, &after_id, &filter.limit, &filter.payment_id])
        .await?
        .iter()
        .map(|r| {
            Ok(Unmatched {
                event_id: r.try_get("event_id")?,
                event_type: r.try_get("event_type")?,
                processed_at: r.try_get("processed_at")?,
                deliveries: r.try_get("deliveries")?,
                payment_id: r.try_get("payment_id")?,
                order_id: r.try_get("order_id")?,
                age_seconds: r.try_get("age_seconds")?,
            })
        })
        .collect()
}
