-- One batch of processed events past the retention, deleted oldest first
-- under the pruner's advisory lock (see prune_outbox.sql). Once an event is
-- gone, a redelivery of it would be processed as new. Returns whether the
-- lock was had, and the rows deleted.
-- Never an `unmatched` event (money received whose order did not exist yet:
-- its row is the only copy, the provider will not send it again) nor a
-- `discarded` one (an operator's decision, kept as its audit): neither is
-- deleted whatever its age (docs/CONTRACT.md, "Payments before their orders").
-- The rows are deleted by the ctids the retention index found, not by
-- their key: probing the primary key (random ids on processed_events)
-- reads a leaf page per row into the buffers the ingest needs. The
-- statement's snapshot keeps each ctid valid; a row updated meanwhile has
-- moved, and the recheck skips it.
-- $1 retention in days, $2 batch size, $3 the lock's key.
WITH lock AS (
    SELECT pg_try_advisory_xact_lock($3) AS held
), pruned AS (
    DELETE FROM public.processed_events
     WHERE (SELECT held FROM lock) AND ctid = ANY (ARRAY(
           SELECT ctid FROM public.processed_events
            WHERE processed_at < now() - $1 * interval '1 day'
              AND status NOT IN ('unmatched', 'discarded')
            ORDER BY processed_at
            LIMIT $2))
    RETURNING 1
)
SELECT (SELECT held FROM lock) AS held, (SELECT count(*) FROM pruned) AS deleted
