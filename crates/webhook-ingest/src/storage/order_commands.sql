-- The commands of one order (`events show`), found by their idempotency keys
-- $1 (one per kind, for that order: the unique index, never a scan of the
-- outbox by event), oldest first: which event enqueued each, its state, its
-- attempts so far, its last error, when it is due or finished, and who holds
-- it. Not what it sends.
SELECT id, kind, event_id, status, attempts, last_error, created_at, available_at, finished_at,
       lease_owner, leased_until, idempotency_key
FROM public.outbox
WHERE idempotency_key = ANY($1::text[])
ORDER BY id
