//! Taking rows: the claim of a due batch under a lease ([`claim_due_batch`]),
//! and the recheck of one claimed row before it is sent ([`still_pending`]).

use std::time::{Duration, Instant};

use db::{Column, Executor, Sql, col};
use tokio_postgres::types::Type;

use super::RowKind;

/// Due, unleased, pending rows in due order, leased to the caller; a poison
/// row goes dead instead of being returned (see the file).
pub(crate) const CLAIM: Sql = Sql::new(
    "outbox-relay/claim.sql",
    include_str!("claim.sql"),
    &[Type::INT8, Type::TEXT, Type::INT8, Type::INT4, Type::FLOAT8],
)
.returning(CLAIM_COLUMNS);
const CLAIM_COLUMNS: &[Column] = &[
    col("id", Type::INT8),
    col("kind", Type::TEXT),
    col("payload", Type::JSONB),
    col("idempotency_key", Type::TEXT),
    col("attempts", Type::INT4),
    col("claims", Type::INT4),
    col("trace_context", Type::TEXT),
    col("event_id", Type::TEXT),
    col("due_at", Type::FLOAT8),
];

/// Whether a claimed row is still pending under its claim.
pub(crate) const STILL_PENDING: Sql = Sql::new(
    "outbox-relay/still_pending.sql",
    include_str!("still_pending.sql"),
    &[Type::INT8, Type::TEXT, Type::INT4],
)
.returning(STILL_PENDING_COLUMNS);
const STILL_PENDING_COLUMNS: &[Column] = &[col("held", Type::INT8)];

/// A claimed row: what to send, and where it belongs in its event's trace.
#[derive(Debug, Clone)]
pub struct ClaimedRow {
    pub id: i64,
    /// Decoded once, here; [`RowKind::Unknown`] for a kind this release
    /// cannot send.
    pub kind: RowKind,
    /// The versioned command payload ([`domain::OutboxPayload`]).
    pub payload: serde_json::Value,
    pub idempotency_key: String,
    /// This attempt's number (1 for the first call).
    pub attempt: i32,
    /// The row's claim count after this claim; with the owner, the claim's
    /// fencing token (never repeats for a row).
    pub claim: i32,
    /// When the lease runs out, by this process's clock (measured from
    /// before the claim was sent, so never later than the server's).
    pub lease_expires: Instant,
    pub trace_context: Option<String>,
    pub event_id: String,
    /// When the row became due (`available_at`, Unix seconds, the server's clock).
    pub due_at: f64,
}

/// Claims up to `limit` due rows under a lease of `lease` for `owner`, in id
/// order, among the rows due at `from` (Unix seconds) or later (`None`: every
/// due row); rows already claimed `max_attempts` times without a verdict go
/// dead instead (see `claim.sql`).
pub async fn claim_due_batch(
    client: &db::Client,
    limit: i64,
    owner: &str,
    lease: Duration,
    max_attempts: u32,
    from: Option<f64>,
) -> Result<Vec<ClaimedRow>, tokio_postgres::Error> {
    let lease_ms = lease.as_millis() as i64;
    let max_attempts = i32::try_from(max_attempts).unwrap_or(i32::MAX);
    let lease_expires = Instant::now() + lease;
    let rows = CLAIM
        .query(client, &[&limit, &owner, &lease_ms, &max_attempts, &from])
        .await?;
    let mut claimed = rows
        .into_iter()
        .map(|r| {
            Ok(ClaimedRow {
                id: r.try_get("id")?,
                kind: r.try_get("kind")?,
                payload: r.try_get("payload")?,
                idempotency_key: r.try_get("idempotency_key")?,
                attempt: r.try_get("attempts")?,
                claim: r.try_get("claims")?,
                trace_context: r.try_get("trace_context")?,
                event_id: r.try_get("event_id")?,
                due_at: r.try_get("due_at")?,
                lease_expires,
            })
        })
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
    claimed.sort_by_key(|r| r.id);
    Ok(claimed)
}

/// Whether `row` is still pending under its claim by `owner`. A shipment
/// that waited for a call slot may have been cancelled by a refund
/// meanwhile: it was not yet under way, so it must not be sent.
pub async fn still_pending(
    client: &(impl Executor + ?Sized),
    row: &ClaimedRow,
    owner: &str,
) -> Result<bool, tokio_postgres::Error> {
    let held: i64 = STILL_PENDING
        .query_one(client, &[&row.id, &owner, &row.claim])
        .await?
        .try_get("held")?;
    Ok(held == 1)
}
