-- Dead rows back to pending, due now, attempts reset, and the relays woken
-- in the same transaction (one notification, only when a row was requeued).
-- $1 the row's id, or NULL for every dead row; $2 the NOTIFY channel.
WITH requeued AS (
    UPDATE public.outbox
       SET status = 'pending', available_at = now(), attempts = 0,
           lease_owner = NULL, leased_until = NULL, finished_at = NULL
     WHERE status = 'dead' AND ($1::int8 IS NULL OR id = $1)
    RETURNING id
)
SELECT count(*) AS requeued,
       (SELECT count(pg_notify($2, '')) FROM (SELECT 1 FROM requeued LIMIT 1) AS any_requeued) AS notified
  FROM requeued
