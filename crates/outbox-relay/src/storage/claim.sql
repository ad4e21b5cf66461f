-- Claims up to $1 due rows for relay $2, each under a lease of $3
-- milliseconds, and returns them in no particular order.
-- $1 batch size, $2 lease owner, $3 lease in ms, $4 RELAY_MAX_ATTEMPTS, $5
-- the earliest due time to look at (Unix seconds; NULL for every due row).
--
-- `due`: pending, due and unleased rows in due order (id order among rows due
-- at the same time), locked with SKIP LOCKED so that concurrent relays take
-- disjoint batches and never wait on each other; the partial index on
-- (available_at, id) WHERE pending keeps its cost independent of the done
-- rows. A claim from $5 starts its index scan there: the entries to the left
-- are mostly those of rows already done, dead until a VACUUM removes them,
-- which a claim from the start walks through every time. Rows left there (a
-- late commit, an expired lease, a released row) wait for the next claim
-- from the start (worker/run.rs). `claimed`: each takes a lease, an attempt
-- and a claim (`claims`, with the owner the claim's fencing token). A row
-- whose every allowed attempt was claimed without an outcome ever recorded
-- is a poison row: it goes dead here, keeping its last error, and is not
-- returned.
WITH due AS (
    SELECT id FROM public.outbox
     WHERE status = 'pending' AND available_at <= now()
       AND available_at >= coalesce(to_timestamp($5::float8), '-infinity')
       AND (leased_until IS NULL OR leased_until <= now())
     ORDER BY available_at, id
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE public.outbox AS o
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
              o.event_id, o.status, o.available_at
)
SELECT id, kind, payload, idempotency_key, attempts, claims, trace_context, event_id,
       extract(epoch FROM available_at)::float8 AS due_at
  FROM claimed WHERE status = 'pending'
