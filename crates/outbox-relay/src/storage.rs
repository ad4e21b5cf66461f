//! All of the relay's SQL.
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
//! Completion is fenced on the claim: a relay records an outcome only for a
//! row it still holds, under the claim it made. The fencing token is the
//! pair (`lease_owner`, `claims`): every claim increments `claims`, which,
//! unlike `attempts` (reset by `dead requeue`), never goes back, so the
//! outcome of a stale claim (a relay that stalled past its lease, whose row
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
//! A row claimed `RELAY_MAX_ATTEMPTS` times without ever recording an
//! outcome (a relay that crashes, or is killed, every time it holds it) is
//! dead-lettered by the claim instead of being claimed again.

use std::time::Duration;

use db::{Executor, Sql};
use tokio_postgres::types::Type;

/// The channel the ingest notifies in its transaction.
pub const NOTIFY_CHANNEL: &str = "outbox_pending";

/// Due rows (pending, due, not leased), as the KEDA autoscaler counts them
/// too: `deploy/` uses this file, and `deploy-check` holds them equal.
pub const COUNT_DUE: &str = include_str!("../sql/count_due.sql");

/// Due, unleased, pending rows in due order (id order among rows due at the same
/// time). `SKIP LOCKED`: concurrent relays take disjoint batches and never wait
/// on each other. The partial index on (available_at, id) WHERE pending keeps
/// the cost independent of how many done rows exist. A row whose every
/// allowed attempt was claimed and none recorded an outcome is a poison row:
/// it goes dead here, keeping its last error, and is not returned.
const CLAIM: Sql = Sql::new("claim", 
    "
WITH due AS (
    SELECT id FROM outbox
     WHERE status = 'pending' AND available_at <= now()
       AND (leased_until IS NULL OR leased_until <= now())
     ORDER BY available_at, id
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE outbox AS o
       SET lease_owner = CASE WHEN o.attempts < $4 THEN $2 END,
           leased_until = CASE WHEN o.attempts < $4 THEN now() + $3::int8 * interval '1 millisecond' END,
           attempts = o.attempts + CASE WHEN o.attempts < $4 THEN 1 ELSE 0 END,
           claims = o.claims + 1,
           status = CASE WHEN o.attempts < $4 THEN 'pending' ELSE 'dead' END,
           finished_at = CASE WHEN o.attempts < $4 THEN NULL ELSE now() END,
           last_error = CASE WHEN o.attempts < $4 THEN o.last_error
                             ELSE format('no attempt left: claimed %s times, the last with no outcome '
                                         'recorded (the relay holding it died or stalled; or '
                                         'RELAY_MAX_ATTEMPTS was lowered); last error: %s',
                                         o.attempts, coalesce(o.last_error, 'none')) END
      FROM due
     WHERE o.id = due.id
    RETURNING o.id, o.kind, o.payload, o.idempotency_key, o.attempts, o.claims, o.trace_context,
              o.event_id, o.status
)
SELECT id, kind, payload, idempotency_key, attempts, claims, trace_context, event_id
  FROM claimed WHERE status = 'pending'",
    // batch size, lease owner, lease in ms, max attempts
    &[Type::INT8, Type::TEXT, Type::INT8, Type::INT4],
);

/// Every outcome of a batch in one statement. `release` hands a row back
/// untouched (it was claimed but never sent: shutdown, or too little lease
/// left to send it), undoing its attempt. A row a refund cancelled while it
/// was held stays cancelled unless the outcome is `done` (the call under way
/// succeeded: the row records that it shipped).
const COMPLETE: Sql = Sql::new("complete", 
    "
UPDATE outbox AS o
   SET status = CASE
                  WHEN o.status = 'cancelled' THEN CASE v.outcome WHEN 'done' THEN 'done' ELSE 'cancelled' END
                  WHEN v.outcome IN ('done', 'dead') THEN v.outcome
                  ELSE 'pending' END,
       finished_at = CASE
                       WHEN v.outcome = 'done' THEN now()
                       WHEN o.status = 'cancelled' THEN o.finished_at
                       WHEN v.outcome = 'dead' THEN now() END,
       available_at = CASE
                        WHEN v.outcome = 'retry' AND o.status = 'pending'
                          THEN now() + v.delay_ms * interval '1 millisecond'
                        ELSE o.available_at END,
       attempts = o.attempts - CASE WHEN v.outcome = 'release' THEN 1 ELSE 0 END,
       lease_owner = NULL,
       leased_until = NULL,
       last_error = CASE
                      WHEN v.outcome = 'done' THEN NULL
                      WHEN v.outcome = 'release' THEN o.last_error
                      WHEN o.status = 'cancelled'
                        THEN o.last_error || '; the call under way then failed: ' || v.error
                      ELSE v.error END
  FROM unnest($1::int8[], $2::text[], $3::int8[], $4::text[], $5::int4[]) AS v(id, outcome, delay_ms, error, claim)
 -- The fence: still ours, under this very claim. Only an undecided row
 -- (pending, or cancelled while held) has an owner, and a primary-key plan
 -- whatever the statistics.
 WHERE o.id = v.id AND o.lease_owner = $6 AND o.claims = v.claim
RETURNING o.id, o.status, extract(epoch FROM now() - o.created_at)::float8",
    // ids, outcomes, delays (ms), errors, the claims' tokens, lease owner
    &[Type::INT8_ARRAY, Type::TEXT_ARRAY, Type::INT8_ARRAY, Type::TEXT_ARRAY, Type::INT4_ARRAY, Type::TEXT],
);

/// A claimed row: what to send, and where it belongs in its event's trace.
#[derive(Debug, Clone)]
pub struct ClaimedRow {
    pub id: i64,
    pub kind: String,
    pub payload: serde_json::Value,
    pub idempotency_key: String,
    /// This attempt's number (1 for the first call).
    pub attempt: i32,
    /// The row's claim count after this claim; with the owner, the claim's
    /// fencing token (never repeats for a row).
    pub claim: i32,
    /// When the lease runs out, by this process's clock (measured from
    /// before the claim was sent, so never later than the server's).
    pub lease_expires: std::time::Instant,
    pub trace_context: Option<String>,
    pub event_id: String,
}

/// What to record for a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Completion {
    Done,
    Retry { delay: Duration, error: String },
    Dead { error: String },
    Release,
}

impl Completion {
    fn outcome(&self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Retry { .. } => "retry",
            Self::Dead { .. } => "dead",
            Self::Release => "release",
        }
    }
}

/// A recorded row: its new status and, when done, its age (enqueue to done).
#[derive(Debug, Clone)]
pub struct Recorded {
    pub id: i64,
    pub status: String,
    pub age_seconds: f64,
}

/// Claims up to `limit` due rows under a lease of `lease` for `owner`;
/// rows already claimed `max_attempts` times without an outcome go dead
/// instead (see [`CLAIM`]).
pub async fn claim_due_batch(
    client: &db::Client,
    limit: i64,
    owner: &str,
    lease: Duration,
    max_attempts: u32,
) -> Result<Vec<ClaimedRow>, tokio_postgres::Error> {
    let lease_ms = lease.as_millis() as i64;
    let max_attempts = i32::try_from(max_attempts).unwrap_or(i32::MAX);
    let lease_expires = std::time::Instant::now() + lease;
    let rows = CLAIM
        .query(client, &[&limit, &owner, &lease_ms, &max_attempts])
        .await?;
    let mut claimed: Vec<ClaimedRow> = rows
        .into_iter()
        .map(|r| ClaimedRow {
            id: r.get("id"),
            kind: r.get("kind"),
            payload: r.get("payload"),
            idempotency_key: r.get("idempotency_key"),
            attempt: r.get("attempts"),
            claim: r.get("claims"),
            trace_context: r.get("trace_context"),
            event_id: r.get("event_id"),
            lease_expires,
        })
        .collect();
    claimed.sort_by_key(|r| r.id);
    Ok(claimed)
}

/// One outcome to record: the row, the claim it belongs to (its fencing
/// token, [`ClaimedRow::claim`]), what happened.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub id: i64,
    pub claim: i32,
    pub completion: Completion,
}

/// Records a batch of outcomes, fenced on `owner` and each claim's token.
/// Rows this relay no longer holds under that claim are skipped (and absent
/// from the result).
pub async fn record_outcomes(
    client: &db::Client,
    owner: &str,
    outcomes: &[Outcome],
) -> Result<Vec<Recorded>, tokio_postgres::Error> {
    if outcomes.is_empty() {
        return Ok(Vec::new());
    }
    let mut ids = Vec::with_capacity(outcomes.len());
    let mut kinds = Vec::with_capacity(outcomes.len());
    let mut delays = Vec::with_capacity(outcomes.len());
    let mut errors: Vec<Option<&str>> = Vec::with_capacity(outcomes.len());
    let mut claims = Vec::with_capacity(outcomes.len());
    for Outcome {
        id,
        claim,
        completion,
    } in outcomes
    {
        ids.push(*id);
        claims.push(*claim);
        kinds.push(completion.outcome());
        match completion {
            Completion::Retry { delay, error } => {
                delays.push(delay.as_millis() as i64);
                errors.push(Some(error));
            }
            Completion::Dead { error } => {
                delays.push(0);
                errors.push(Some(error));
            }
            Completion::Done | Completion::Release => {
                delays.push(0);
                errors.push(None);
            }
        }
    }
    let rows = COMPLETE
        .query(client, &[&ids, &kinds, &delays, &errors, &claims, &owner])
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| Recorded {
            id: r.get(0),
            status: r.get(1),
            age_seconds: r.get(2),
        })
        .collect())
}

/// Whether a claimed row is still pending under this claim. A shipment that
/// waited for a call slot may have been cancelled by a refund meanwhile: it
/// was not yet under way, so it must not be sent.
const STILL_PENDING: Sql = Sql::new("still_pending", 
    "SELECT count(*) FROM outbox WHERE id = $1 AND lease_owner = $2 AND claims = $3 AND status = 'pending'",
    // id, lease owner, the claim's token
    &[Type::INT8, Type::TEXT, Type::INT4],
);

pub async fn still_pending(
    client: &(impl Executor + ?Sized),
    row: &ClaimedRow,
    owner: &str,
) -> Result<bool, tokio_postgres::Error> {
    let found: i64 = STILL_PENDING
        .query_one(client, &[&row.id, &owner, &row.claim])
        .await?
        .get(0);
    Ok(found == 1)
}

/// Database-derived gauges.
#[derive(Debug, Clone, Copy, Default)]
pub struct Backlog {
    pub pending: i64,
    pub oldest_pending_age_seconds: f64,
    pub dead: i64,
    pub due: i64,
}

const BACKLOG: Sql = Sql::new("backlog", 
    "SELECT count(*),
            coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8,
            (SELECT count(*) FROM outbox WHERE status = 'dead'),
            count(*) FILTER (WHERE available_at <= now() AND (leased_until IS NULL OR leased_until <= now()))
       FROM outbox WHERE status = 'pending'",
    &[],
);

/// Counts for the gauges: served by the partial indexes, cheap at any size of history.
pub async fn backlog(client: &(impl Executor + ?Sized)) -> Result<Backlog, tokio_postgres::Error> {
    let row = BACKLOG.query_one(client, &[]).await?;
    Ok(Backlog {
        pending: row.get(0),
        oldest_pending_age_seconds: row.get(1),
        dead: row.get(2),
        due: row.get(3),
    })
}

/// A dead row, for `dead list`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeadRow {
    pub id: i64,
    pub kind: String,
    pub idempotency_key: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    /// Seconds since the row was enqueued (`age`, as `dead list --json` names it).
    #[serde(rename = "age")]
    pub age_seconds: f64,
    pub event_id: String,
}

const DEAD_ROWS: Sql = Sql::new("dead_rows", 
    "SELECT id, kind, idempotency_key, attempts, last_error,
            extract(epoch FROM now() - created_at)::float8, event_id
       FROM outbox WHERE status = 'dead' ORDER BY id",
    &[],
);

pub async fn dead_rows(client: &(impl Executor + ?Sized)) -> Result<Vec<DeadRow>, tokio_postgres::Error> {
    let rows = DEAD_ROWS.query(client, &[]).await?;
    Ok(rows
        .into_iter()
        .map(|r| DeadRow {
            id: r.get(0),
            kind: r.get(1),
            idempotency_key: r.get(2),
            attempts: r.get(3),
            last_error: r.get(4),
            age_seconds: r.get(5),
            event_id: r.get(6),
        })
        .collect())
}

const REQUEUE_DEAD: Sql = Sql::new("requeue_dead", 
    "WITH requeued AS (
         UPDATE outbox SET status = 'pending', available_at = now(), attempts = 0,
                           lease_owner = NULL, leased_until = NULL, finished_at = NULL
          WHERE status = 'dead' AND ($1::int8 IS NULL OR id = $1)
         RETURNING id)
     SELECT count(*), (SELECT count(pg_notify('outbox_pending', '')) FROM (SELECT 1 FROM requeued LIMIT 1) n)
       FROM requeued",
    &[Type::INT8],
);

/// Dead rows back to pending, due now, attempts reset; `None` requeues all.
/// Notifies the relays in the same transaction.
pub async fn requeue_dead(
    client: &(impl Executor + ?Sized),
    id: Option<i64>,
) -> Result<u64, tokio_postgres::Error> {
    let rows = REQUEUE_DEAD.query(client, &[&id]).await?;
    Ok(rows.first().map_or(0, |r| r.get::<_, i64>(0) as u64))
}

const COUNTS_BY_STATUS_AND_KIND: Sql = Sql::new("counts_by_status_and_kind", 
    "SELECT status, kind, count(*) FROM outbox GROUP BY status, kind ORDER BY status, kind",
    &[],
);

/// Rows by status and kind.
pub async fn counts_by_status_and_kind(
    client: &(impl Executor + ?Sized),
) -> Result<Vec<(String, String, i64)>, tokio_postgres::Error> {
    let rows = COUNTS_BY_STATUS_AND_KIND.query(client, &[]).await?;
    Ok(rows.into_iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
}

/// Rows deleted per statement: small enough that each delete is short and
/// never blocks the ingest or bloats one transaction.
pub const PRUNE_BATCH: i64 = 1000;

/// The pruner's session: a batch that waits on a lock or runs away fails
/// after a minute (counted, logged, retried at the next run) rather than
/// hanging the pruner unseen. Behind a transaction-mode pooler the role's
/// own settings apply instead (deploy/sql/roles.sql).
pub fn prune_connect_options() -> db::ConnectOptions {
    db::ConnectOptions {
        application_name: "outbox-relay-prune",
        statement_timeout: Some(std::time::Duration::from_secs(60)),
        abort_when_client_leaves: false,
        asynchronous_commit: false,
        pool_size: 1,
        pool_wait: std::time::Duration::from_secs(5),
    }
}

/// Advisory lock key of the pruner: one replica prunes at a time.
const PRUNE_LOCK: i64 = 0x5052_554e_4552_0001;

/// One batch of done and cancelled outbox rows past the retention, deleted
/// under the pruner's lock. The lock is a transaction lock taken by the
/// statement itself (its own transaction), so it needs no session: it works
/// through a transaction-mode pooler, and is never left behind by a pruner
/// that died. Returns whether the lock was had, and the rows deleted.
const PRUNE_OUTBOX: Sql = Sql::new("prune_outbox", 
    "WITH lock AS (SELECT pg_try_advisory_xact_lock($3) AS held),
          pruned AS (
              DELETE FROM outbox WHERE (SELECT held FROM lock) AND id IN (
                  SELECT id FROM outbox
                   WHERE status IN ('done', 'cancelled') AND finished_at < now() - $1 * interval '1 day'
                   ORDER BY finished_at LIMIT $2)
              RETURNING 1)
     SELECT (SELECT held FROM lock), (SELECT count(*) FROM pruned)",
    // retention in days, batch size, lock key
    &[Type::FLOAT8, Type::INT8, Type::INT8],
);

/// The same for processed events: once gone, a redelivery would be new.
const PRUNE_EVENTS: Sql = Sql::new("prune_events", 
    "WITH lock AS (SELECT pg_try_advisory_xact_lock($3) AS held),
          pruned AS (
              DELETE FROM processed_events WHERE (SELECT held FROM lock) AND event_id IN (
                  SELECT event_id FROM processed_events
                   WHERE processed_at < now() - $1 * interval '1 day'
                   ORDER BY processed_at LIMIT $2)
              RETURNING 1)
     SELECT (SELECT held FROM lock), (SELECT count(*) FROM pruned)",
    &[Type::FLOAT8, Type::INT8, Type::INT8],
);

#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct Pruned {
    pub outbox_rows: u64,
    pub processed_events: u64,
    /// False when another replica held the prune lock.
    pub ran: bool,
}

/// Deletes done/cancelled outbox rows and processed events older than the
/// retention, in batches of [`PRUNE_BATCH`], each its own short transaction
/// under the pruner's lock. A replica that finds the lock taken stops: one
/// replica prunes at a time, and none waits for another.
pub async fn prune(
    client: &(impl Executor + ?Sized),
    retention_days: u32,
) -> Result<Pruned, tokio_postgres::Error> {
    let days = f64::from(retention_days);
    let outbox = in_batches(client, &PRUNE_OUTBOX, days).await?;
    let events = match outbox {
        Batches::Finished { .. } => in_batches(client, &PRUNE_EVENTS, days).await?,
        Batches::LockedOut { .. } => Batches::LockedOut { deleted: 0 },
    };
    Ok(Pruned {
        outbox_rows: outbox.deleted(),
        processed_events: events.deleted(),
        // Anything deleted, or the lock at least once.
        ran: outbox != Batches::LockedOut { deleted: 0 },
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Batches {
    /// Every row past the retention is gone.
    Finished { deleted: u64 },
    /// Another replica held the lock at some batch: it carries on, we stop.
    LockedOut { deleted: u64 },
}

impl Batches {
    fn deleted(self) -> u64 {
        match self {
            Self::Finished { deleted } | Self::LockedOut { deleted } => deleted,
        }
    }
}

async fn in_batches(
    client: &(impl Executor + ?Sized),
    statement: &Sql,
    days: f64,
) -> Result<Batches, tokio_postgres::Error> {
    let mut deleted = 0;
    loop {
        let row = statement
            .query_one(client, &[&days, &PRUNE_BATCH, &PRUNE_LOCK])
            .await?;
        if !row.get::<_, bool>(0) {
            return Ok(Batches::LockedOut { deleted });
        }
        let n = row.get::<_, i64>(1) as u64;
        deleted += n;
        if n < PRUNE_BATCH as u64 {
            return Ok(Batches::Finished { deleted });
        }
    }
}

/// What `audit` reports from the database, over a window.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Audit {
    pub since_seconds: u64,
    /// Deliveries received for events first processed in the window.
    pub deliveries: i64,
    pub distinct_events: i64,
    pub duplicate_deliveries: i64,
    /// Events by recorded status (processed, refunded, unmatched, ...).
    pub events_by_status: Vec<(String, i64)>,
    /// Outbox rows created in the window, by kind and status.
    pub commands: Vec<(String, String, i64)>,
    /// (kind, order) pairs with more than one row: zero by construction (the
    /// idempotency key is unique); counted so a report can say so.
    pub double_enqueued: i64,
}

/// Events first processed in the window (`$1` seconds): how many, and their deliveries.
const AUDIT_TOTALS: Sql = Sql::new("audit_totals", 
    "SELECT count(*), coalesce(sum(deliveries), 0)::int8
       FROM processed_events WHERE processed_at >= now() - $1 * interval '1 second'",
    &[Type::FLOAT8],
);

const AUDIT_BY_STATUS: Sql = Sql::new("audit_by_status", 
    "SELECT status, count(*) FROM processed_events
      WHERE processed_at >= now() - $1 * interval '1 second' GROUP BY status ORDER BY status",
    &[Type::FLOAT8],
);

const AUDIT_COMMANDS: Sql = Sql::new("audit_commands", 
    "SELECT kind, status, count(*) FROM outbox
      WHERE created_at >= now() - $1 * interval '1 second' GROUP BY kind, status ORDER BY kind, status",
    &[Type::FLOAT8],
);

const AUDIT_DOUBLED: Sql = Sql::new("audit_doubled", 
    "SELECT count(*) FROM (SELECT 1 FROM outbox WHERE created_at >= now() - $1 * interval '1 second'
                             GROUP BY kind, order_id HAVING count(*) > 1) d",
    &[Type::FLOAT8],
);

pub async fn audit(
    client: &(impl Executor + ?Sized),
    since: Duration,
) -> Result<Audit, tokio_postgres::Error> {
    let secs = since.as_secs_f64();
    let totals = AUDIT_TOTALS.query_one(client, &[&secs]).await?;
    let by_status = AUDIT_BY_STATUS.query(client, &[&secs]).await?;
    let commands = AUDIT_COMMANDS.query(client, &[&secs]).await?;
    let doubled = AUDIT_DOUBLED.query_one(client, &[&secs]).await?;
    let distinct_events: i64 = totals.get(0);
    let deliveries: i64 = totals.get(1);
    Ok(Audit {
        since_seconds: since.as_secs(),
        deliveries,
        distinct_events,
        duplicate_deliveries: deliveries - distinct_events,
        events_by_status: by_status.iter().map(|r| (r.get(0), r.get(1))).collect(),
        commands: commands.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect(),
        double_enqueued: doubled.get(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_declares_a_type_per_parameter() {
        for sql in [
            &CLAIM,
            &COMPLETE,
            &STILL_PENDING,
            &BACKLOG,
            &DEAD_ROWS,
            &REQUEUE_DEAD,
            &COUNTS_BY_STATUS_AND_KIND,
            &PRUNE_OUTBOX,
            &PRUNE_EVENTS,
            &AUDIT_TOTALS,
            &AUDIT_BY_STATUS,
            &AUDIT_COMMANDS,
            &AUDIT_DOUBLED,
        ] {
            assert_eq!(sql.placeholders(), sql.types.len(), "{}", sql.text);
        }
    }
}
