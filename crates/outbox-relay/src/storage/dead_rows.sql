-- The dead rows, oldest id first, for `dead list`: $1 only this kind (NULL:
-- every kind), $2 at most this many, $3 only those after this id (NULL: from
-- the first; the next page). `age_seconds` is the time since the row was
-- enqueued; `total` how many dead rows of $1 there are in all (dead rows are
-- few: the partial index holds only them).
WITH dead AS (
    SELECT id, kind, idempotency_key, event_id, order_id, attempts, last_error, finished_at, created_at
      FROM public.outbox
     WHERE status = 'dead' AND ($1::text IS NULL OR kind = $1::text)
)
SELECT id, kind, idempotency_key, event_id, order_id, attempts, last_error, finished_at,
       extract(epoch FROM now() - created_at)::float8 AS age_seconds,
       (SELECT count(*) FROM dead) AS total
  FROM dead
 WHERE $3::int8 IS NULL OR id > $3::int8
 ORDER BY id
 LIMIT $2
