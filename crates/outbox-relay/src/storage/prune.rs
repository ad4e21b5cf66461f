//! Retention: done and cancelled outbox rows, and processed events, deleted
//! once older than `RETENTION_DAYS`, in short batches under an advisory lock.

use std::time::{Duration, Instant};

use db::{Column, Executor, Sql, col};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

pub(crate) const PRUNE_OUTBOX: Sql = Sql::new(
    "outbox-relay/prune_outbox.sql",
    include_str!("prune_outbox.sql"),
    &[Type::FLOAT8, Type::INT8, Type::INT8],
)
.returning(PRUNE_OUTBOX_COLUMNS);
const PRUNE_OUTBOX_COLUMNS: &[Column] = &[col("held", Type::BOOL), col("deleted", Type::INT8)];

pub(crate) const PRUNE_EVENTS: Sql = Sql::new(
    "outbox-relay/prune_events.sql",
    include_str!("prune_events.sql"),
    &[Type::FLOAT8, Type::INT8, Type::INT8],
)
.returning(PRUNE_EVENTS_COLUMNS);
const PRUNE_EVENTS_COLUMNS: &[Column] = &[col("held", Type::BOOL), col("deleted", Type::INT8)];

/// The session's WAL full-page images compressed (`compress_wal.sql`).
pub(crate) const COMPRESS_WAL: Sql = Sql::new(
    "outbox-relay/compress_wal.sql",
    include_str!("compress_wal.sql"),
    &[Type::TEXT],
)
.returning(COMPRESS_WAL_COLUMNS);
const COMPRESS_WAL_COLUMNS: &[Column] = &[col("wal_compression", Type::TEXT)];

/// Rows deleted per statement: small enough that each delete is short and
/// never blocks the ingest or bloats one transaction, and that the WAL one
/// batch writes (full-page images of every page it touches first after a
/// checkpoint) stays small: an ingest commit flushes whatever WAL precedes
/// it, so a large batch is a wait on every commit behind it. Measured in
/// `make bench` (phase prune, quick, three rounds): 1,000 rows back to back
/// added 7-38 ms to the ingest's p99 at half of peak; 250 rows at half duty
/// added -2..5 ms, at about 15,000 rows a second (20,000 since the deletes
/// go by ctid, `prune_events.sql`).
pub const PRUNE_BATCH: i64 = 250;

/// Advisory lock key of the pruner: one replica prunes at a time.
const PRUNE_LOCK: i64 = 0x5052_554e_4552_0001;

/// The pruner's session: a batch that waits on a lock or runs away fails
/// after a minute (counted, logged, retried at the next run) rather than
/// hanging the pruner unseen. Its deletes commit without waiting for the WAL
/// flush, as the relay's writes do: a delete lost in a server crash is a row
/// the next prune deletes again. A synchronous commit per batch was a WAL
/// flush the ingest's commits queued behind, 60 to 80 a second (make bench,
/// phase prune, full size, five runs against four: the ingest's p99 during
/// the prune 28.7-56.3 ms, median 37.9, against 27.1-34.2, median 28.4; the
/// prune 100-141 s against 90-107 s, 1.02-1.44 GB of WAL against
/// 0.93-1.07). Behind a transaction-mode pooler the role's own settings
/// apply instead (deploy/sql/roles.sql: `relay_app` commits asynchronously
/// too).
pub fn prune_connect_options() -> db::ConnectOptions {
    db::ConnectOptions {
        application_name: "outbox-relay-prune",
        statement_timeout: Some(Duration::from_secs(60)),
        lock_timeout: None,
        abort_when_client_leaves: false,
        asynchronous_commit: true,
        generic_plans: false,
        index_paths: true,
        pool_size: 1,
        pool_wait: Duration::from_secs(5),
    }
}

#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct Pruned {
    pub outbox_rows: u64,
    pub processed_events: u64,
    /// Delete statements run, both tables.
    pub batches: u64,
    /// False when another replica held the prune lock.
    pub ran: bool,
    /// The method that compressed the prune's full-page images, when the
    /// relay's role may set `wal_compression` ([`compress_wal`]); `None`:
    /// the server's own setting applied.
    pub wal_compression: Option<&'static str>,
}

/// Deletes done/cancelled outbox rows and processed events older than the
/// retention, in batches of [`PRUNE_BATCH`], each its own short transaction
/// under the pruner's lock. A replica that finds the lock taken stops: one
/// replica prunes at a time, and none waits for another.
pub async fn prune(
    client: &(impl Executor + ?Sized),
    retention_days: u32,
) -> Result<Pruned, tokio_postgres::Error> {
    prune_reporting(client, retention_days, |_| {}).await
}

/// Where a prune is, after a batch: `outbox-relay prune`'s progress line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PruneProgress {
    /// The table of the batch just run.
    pub table: PruneTable,
    pub outbox_rows: u64,
    pub processed_events: u64,
    /// Delete statements run so far, both tables.
    pub batches: u64,
}

/// The tables the prune deletes from, in the order it does.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum PruneTable {
    #[default]
    Outbox,
    ProcessedEvents,
}

impl PruneTable {
    pub fn name(self) -> &'static str {
        match self {
            Self::Outbox => "outbox",
            Self::ProcessedEvents => "processed_events",
        }
    }
}

/// [`prune`], calling `on_batch` after every batch (a backlog of millions
/// of rows takes minutes; the operator's command says where it is).
pub async fn prune_reporting(
    client: &(impl Executor + ?Sized),
    retention_days: u32,
    mut on_batch: impl FnMut(&PruneProgress),
) -> Result<Pruned, tokio_postgres::Error> {
    let days = f64::from(retention_days);
    let wal_compression = compress_wal(client).await;
    let mut progress = PruneProgress::default();
    let outbox = in_batches(client, PruneTable::Outbox, days, &mut progress, &mut on_batch).await?;
    let events = match outbox {
        Batches::Finished { .. } => {
            in_batches(
                client,
                PruneTable::ProcessedEvents,
                days,
                &mut progress,
                &mut on_batch,
            )
            .await?
        }
        Batches::LockedOut { .. } => Batches::LockedOut { deleted: 0 },
    };
    Ok(Pruned {
        outbox_rows: outbox.deleted(),
        processed_events: events.deleted(),
        batches: progress.batches,
        // Anything deleted, or the lock at least once.
        ran: outbox != Batches::LockedOut { deleted: 0 },
        wal_compression,
    })
}

/// Compresses the full-page images the session's deletes write: lz4, else
/// pglz (a server built without lz4). Measured (make bench, phase prune, a
/// 2M-row backlog at half of the ingest's peak): WAL compression cut the
/// prune's WAL by more than half and the ingest's p99 during it (see
/// docs/BENCHMARK.md). `None` when the role may not set `wal_compression`:
/// the prune then runs exactly as before, with the server's setting.
async fn compress_wal(client: &(impl Executor + ?Sized)) -> Option<&'static str> {
    for method in ["lz4", "pglz"] {
        match COMPRESS_WAL.query_one(client, &[&method]).await {
            Ok(_) => return Some(method),
            // This method is not built into the server: the next one.
            Err(e) if e.code() == Some(&SqlState::INVALID_PARAMETER_VALUE) => {}
            Err(e) => {
                tracing::debug!(error = %e, "wal_compression not set: the server's setting applies");
                return None;
            }
        }
    }
    None
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
    table: PruneTable,
    days: f64,
    progress: &mut PruneProgress,
    on_batch: &mut impl FnMut(&PruneProgress),
) -> Result<Batches, tokio_postgres::Error> {
    let statement = match table {
        PruneTable::Outbox => &PRUNE_OUTBOX,
        PruneTable::ProcessedEvents => &PRUNE_EVENTS,
    };
    let mut deleted = 0;
    loop {
        let started = Instant::now();
        let row = statement
            .query_one(client, &[&days, &PRUNE_BATCH, &PRUNE_LOCK])
            .await?;
        if !row.try_get::<_, bool>("held")? {
            return Ok(Batches::LockedOut { deleted });
        }
        let n = row.try_get::<_, i64>("deleted")? as u64;
        deleted += n;
        progress.table = table;
        progress.batches += 1;
        match table {
            PruneTable::Outbox => progress.outbox_rows += n,
            PruneTable::ProcessedEvents => progress.processed_events += n,
        }
        on_batch(progress);
        if n < PRUNE_BATCH as u64 {
            return Ok(Batches::Finished { deleted });
        }
        tokio::time::sleep(pause_after(started.elapsed())).await;
    }
}

/// How long the pruner rests after a full batch that took `batch`: as long
/// again, up to a second. A batch is a backend busy on one core, writing WAL
/// that the ingest's commits then wait behind (their waits are `WALWrite`
/// and `WALSync`); back to back, the batches held one of a small database's
/// cores and its WAL for the whole prune. At half duty the prune still
/// deletes far more a second than a day of webhooks a relay interval leaves
/// behind, and the ingest keeps its tail.
fn pause_after(batch: Duration) -> Duration {
    batch.min(Duration::from_secs(1))
}
