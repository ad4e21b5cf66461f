-- One batch of done and cancelled outbox rows past the retention, deleted
-- oldest first under the pruner's advisory lock. The lock is a transaction
-- lock taken by the statement itself, so it needs no session (it works
-- through a transaction-mode pooler) and a pruner that died never leaves it
-- behind. Returns whether the lock was had, and the rows deleted.
-- The rows are deleted by the ctids the retention index found, not by
-- their key: probing the primary key (random ids on processed_events)
-- reads a leaf page per row into the buffers the ingest needs. The
-- statement's snapshot keeps each ctid valid; a row updated meanwhile has
-- moved, and the recheck skips it.
-- $1 retention in days, $2 batch size, $3 the lock's key.
WITH lock AS (
    SELECT pg_try_advisory_xact_lock($3) AS held
), pruned AS (
    DELETE FROM public.outbox
     WHERE (SELECT held FROM lock) AND ctid = ANY (ARRAY(
           SELECT ctid FROM public.outbox
            WHERE status IN ('done', 'cancelled') AND finished_at < now() - $1 * interval '1 day'
            ORDER BY finished_at
            LIMIT $2))
    RETURNING 1
)
SELECT (SELECT held FROM lock) AS held, (SELECT count(*) FROM pruned) AS deleted
