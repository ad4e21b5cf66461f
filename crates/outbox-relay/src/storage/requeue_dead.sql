-- Dead rows back to pending, due now, attempts reset, and the relays woken
-- in the same transaction (one notification, only when a row was requeued).
-- $1 the row's id, or NULL for every dead row; $2 only this kind (NULL: every
-- kind); $3 the NOTIFY channel; $4 a dry run: nothing changes, the rows that
-- would be requeued are returned (locked, so a dry run and a requeue agree
-- on a row another requeue holds). Returns the rows requeued, oldest first.
WITH chosen AS (
    SELECT id
      FROM public.outbox
     WHERE status = 'dead' AND ($1::int8 IS NULL OR id = $1::int8)
       AND ($2::text IS NULL OR kind = $2::text)
     ORDER BY id
       FOR UPDATE
), requeued AS (
    UPDATE public.outbox AS o
       SET status = 'pending', available_at = now(), attempts = 0,
           lease_owner = NULL, leased_until = NULL, finished_at = NULL
      FROM chosen
     WHERE o.id = chosen.id AND NOT $4::bool
    RETURNING o.id
), notified AS (
    SELECT count(pg_notify($3::text, '')) AS n FROM (SELECT 1 FROM requeued LIMIT 1) AS any_requeued
)
SELECT o.id, o.kind, o.idempotency_key, o.attempts, o.last_error, (SELECT n FROM notified) AS notified
  FROM public.outbox AS o
  JOIN chosen ON chosen.id = o.id
 ORDER BY o.id
