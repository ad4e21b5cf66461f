-- The dead rows, oldest id first, for `dead list`; `age_seconds` is the time
-- since the row was enqueued. No parameters.
SELECT id, kind, idempotency_key, attempts, last_error,
       extract(epoch FROM now() - created_at)::float8 AS age_seconds, event_id
  FROM public.outbox
 WHERE status = 'dead'
 ORDER BY id
