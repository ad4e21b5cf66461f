-- One batch of done and cancelled outbox rows past the retention, deleted
-- oldest first under the pruner's advisory lock. The lock is a transaction
-- lock taken by the statement itself, so it needs no session (it works
-- through a transaction-mode pooler) and a pruner that died never leaves it
-- behind. Returns whether the lock was had, and the rows deleted.
-- $1 retention in days, $2 batch size, $3 the lock's key.
WITH lock AS (
    SELECT pg_try_advisory_xact_lock($3) AS held
), pruned AS (
    DELETE FROM public.outbox
     WHERE (SELECT held FROM lock) AND id IN (
           SELECT id FROM public.outbox
            WHERE status IN ('done', 'cancelled') AND finished_at < now() - $1 * interval '1 day'
            ORDER BY finished_at
            LIMIT $2)
    RETURNING 1
)
SELECT (SELECT held FROM lock) AS held, (SELECT count(*) FROM pruned) AS deleted
