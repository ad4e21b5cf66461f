//! Recording what became of claimed rows: one statement per batch of
//! [`RowVerdict`]s, fenced on each row's claim.

use std::time::Duration;

use db::{Column, Sql, col};
use domain::OutboxStatus;
use tokio_postgres::types::Type;

use super::Status;

/// Every verdict of a batch in one statement (see the file).
pub(crate) const COMPLETE: Sql = Sql::new(
    "outbox-relay/complete.sql",
    include_str!("complete.sql"),
    &[
        Type::INT8_ARRAY,
        Type::TEXT_ARRAY,
        Type::INT8_ARRAY,
        Type::TEXT_ARRAY,
        Type::INT4_ARRAY,
        Type::TEXT,
    ],
)
.returning(COMPLETE_COLUMNS);
const COMPLETE_COLUMNS: &[Column] = &[
    col("id", Type::INT8),
    col("status", Type::TEXT),
    col("age_seconds", Type::FLOAT8),
];

/// What is recorded for a claimed row: the relay's verdict on it, reached
/// from what its call produced ([`crate::dispatch::CallResult`], through
/// [`crate::policy::RetryPolicy::verdict`]) or without a call at all.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Delivered: the row is done.
    Done,
    /// Due again after `delay`, keeping `error` as the row's last error.
    Retry { delay: Duration, error: String },
    /// Given up: the row waits for an operator.
    Dead { error: String },
    /// Never sent (shutdown, too little lease left, cancelled while it
    /// waited): handed back untouched, due at once, its attempt undone.
    Release,
}

impl Verdict {
    /// The verdict as the statement takes it, and as the `outcome` metric
    /// label and log field name it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Retry { .. } => "retry",
            Self::Dead { .. } => "dead",
            Self::Release => "release",
        }
    }
}

/// A verdict on one row, under the claim it was reached in
/// ([`super::ClaimedRow::claim`]): with the owner, the claim's fence.
#[derive(Debug, Clone, PartialEq)]
pub struct RowVerdict {
    pub id: i64,
    pub claim: i32,
    pub verdict: Verdict,
}

/// A recorded row: its new status and its age (enqueue to now).
#[derive(Debug, Clone)]
pub struct Recorded {
    pub id: i64,
    pub status: OutboxStatus,
    pub age_seconds: f64,
}

/// Records a batch of verdicts, fenced on `owner` and each row's claim.
/// Rows this relay no longer holds under that claim are skipped (and absent
/// from the result).
pub async fn record_verdicts(
    client: &db::Client,
    owner: &str,
    verdicts: &[RowVerdict],
) -> Result<Vec<Recorded>, tokio_postgres::Error> {
    if verdicts.is_empty() {
        return Ok(Vec::new());
    }
    let mut ids = Vec::with_capacity(verdicts.len());
    let mut names = Vec::with_capacity(verdicts.len());
    let mut delays = Vec::with_capacity(verdicts.len());
    let mut errors: Vec<Option<&str>> = Vec::with_capacity(verdicts.len());
    let mut claims = Vec::with_capacity(verdicts.len());
    for RowVerdict { id, claim, verdict } in verdicts {
        ids.push(*id);
        claims.push(*claim);
        names.push(verdict.as_str());
        let (delay, error) = match verdict {
            Verdict::Retry { delay, error } => (delay.as_millis() as i64, Some(error.as_str())),
            Verdict::Dead { error } => (0, Some(error.as_str())),
            Verdict::Done | Verdict::Release => (0, None),
        };
        delays.push(delay);
        errors.push(error);
    }
    let rows = COMPLETE
        .query(client, &[&ids, &names, &delays, &errors, &claims, &owner])
        .await?;
    rows.into_iter()
        .map(|r| {
            Ok(Recorded {
                id: r.try_get("id")?,
                status: r.try_get::<_, Status>("status")?.0,
                age_seconds: r.try_get("age_seconds")?,
            })
        })
        .collect()
}
