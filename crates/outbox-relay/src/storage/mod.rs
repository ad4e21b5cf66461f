//! The relay's SQL: one file per step of a row's life, each statement a
//! `.sql` file beside the function that runs it.
//!
//! A row's life: `pending` (due when `available_at <= now()`) -> claimed (still
//! `pending`, with `lease_owner` and `leased_until` set, so it is not due for
//! anyone else until the lease expires) -> `done`, back to `pending` later
//! (retry), or `dead`. Claims and completions are single statements, each its
//! own short transaction; no transaction is open while a downstream call is.
//!
//! The lease columns are not indexed, so taking a lease is a HOT update: no
//! index entry is written, and the due index does not churn. Leased rows stay
//! in the due index and are skipped by the claim; there are never more of
//! them than the calls in flight.
//!
//! Completion is fenced on the claim: a relay records a verdict only for a
//! row it still holds, under the claim it made. The fencing token is the
//! pair (`lease_owner`, `claims`): every claim increments `claims`, which,
//! unlike `attempts` (reset by `dead requeue`), never goes back, so the
//! verdict of a stale claim (a relay that stalled past its lease, whose row
//! was claimed again, by another relay or by itself, before or after a
//! requeue) matches nothing and is dropped.
//!
//! A refund (the ingest) cancels the order's shipment even while a relay
//! holds it, but leaves the lease in place: the holder's call was under way
//! when the refund committed, so its `done` is still recorded (the shipment
//! happened and the row says so), while a retry, a dead end or a release
//! leaves the row cancelled. Only `pending` rows are claimed, so a cancelled
//! row is never called again.
//!
//! A row claimed `RELAY_MAX_ATTEMPTS` times without ever recording a verdict
//! (a relay that crashes, or is killed, every time it holds it) is
//! dead-lettered by the claim instead of being claimed again.
//!
//! # Layout
//! - [`claim`]: the claim of a due batch, and the recheck of one claimed row.
//! - [`complete`]: the fenced recording of a batch of [`Verdict`]s.
//! - [`columns`]: the outbox's `kind` and `status`, decoded as they are read.
//! - [`backlog`](mod@backlog): the gauges, `stats`, and the autoscaler's count of due rows.
//! - [`dead`]: `dead list`, `dead show`, `dead requeue` and `dead discard`.
//! - [`prune`](mod@prune): retention, in batches under an advisory lock.
//! - [`audit`](mod@audit): what `audit` reads from the database.

pub mod audit;
pub mod backlog;
pub mod claim;
pub mod columns;
pub mod complete;
pub mod dead;
pub mod prune;

pub use audit::{Audit, audit};
pub use backlog::{Backlog, COUNT_DUE, StatusKindCount, backlog, backlog_due, counts_by_status_and_kind};
pub use claim::{ClaimedRow, claim_due_batch, still_pending};
pub use columns::{RowKind, Status};
pub use complete::{Recorded, RowVerdict, Verdict, record_verdicts};
pub use dead::{
    DeadFilter, DeadPage, DeadRow, Discarded, OutboxRow, RequeueFilter, Requeued, dead_rows, discard_dead,
    outbox_row, requeue_dead,
};
pub use prune::{
    PRUNE_BATCH, PruneProgress, PruneTable, Pruned, prune, prune_connect_options, prune_reporting,
};

use db::Sql;

/// Every statement the relay and its operator commands run (and the
/// autoscaler's count of due rows), for the test that prepares each against
/// the migrated schema.
pub const STATEMENTS: &[&Sql] = &[
    &claim::CLAIM,
    &claim::STILL_PENDING,
    &complete::COMPLETE,
    &backlog::BACKLOG,
    &backlog::BACKLOG_DUE,
    &backlog::COUNTS_BY_STATUS_AND_KIND,
    &COUNT_DUE,
    &dead::DEAD_ROWS,
    &dead::REQUEUE_DEAD,
    &dead::OUTBOX_ROW,
    &dead::DISCARD_DEAD,
    &prune::PRUNE_OUTBOX,
    &prune::PRUNE_EVENTS,
    &prune::COMPRESS_WAL,
    &audit::AUDIT_TOTALS,
    &audit::AUDIT_BY_STATUS,
    &audit::AUDIT_COMMANDS,
    &audit::AUDIT_DOUBLED,
];

/// The statements of [`STATEMENTS`] the operator's console runs too, as its
/// own role (`ops_console`): the backlog, and the dead letters with their
/// requeue and discard.
pub const CONSOLE_STATEMENTS: &[&Sql] = &[
    &backlog::BACKLOG,
    &backlog::BACKLOG_DUE,
    &dead::DEAD_ROWS,
    &dead::REQUEUE_DEAD,
    &dead::OUTBOX_ROW,
    &dead::DISCARD_DEAD,
];

#[cfg(test)]
mod tests {
    use super::STATEMENTS;

    #[test]
    fn every_statement_declares_a_type_per_parameter() {
        for sql in STATEMENTS {
            assert_eq!(sql.placeholders(), sql.types.len(), "{}", sql.name);
        }
    }

    #[test]
    fn every_statement_but_the_autoscalers_says_what_it_does() {
        for sql in STATEMENTS
            .iter()
            .filter(|s| s.name != "outbox-relay/count_due.sql")
        {
            assert!(sql.text.starts_with("-- "), "{} has no leading comment", sql.name);
        }
    }
}
