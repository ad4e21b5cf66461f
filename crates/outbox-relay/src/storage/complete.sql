-- Records the verdicts of a batch of claimed rows, one row per array index,
-- fenced on the claim that reached them: a row no longer held by this owner
-- under that very claim is left alone (and absent from the result).
-- $1 outbox ids, $2 verdicts (done | retry | dead | release), $3 retry delays
-- in ms, $4 errors, $5 the claims' numbers (`claims`), $6 lease owner.
--
-- `release` hands a row back untouched (claimed but never sent), undoing its
-- attempt. A row a refund cancelled while it was held stays cancelled unless
-- the verdict is `done` (the call under way succeeded: the row records that it
-- shipped). Returns each recorded row's new status and its age (enqueue to now).
UPDATE public.outbox AS o
   SET status = CASE
                  WHEN o.status = 'cancelled' THEN CASE v.verdict WHEN 'done' THEN 'done' ELSE 'cancelled' END
                  WHEN v.verdict IN ('done', 'dead') THEN v.verdict
                  ELSE 'pending' END,
       finished_at = CASE
                       WHEN v.verdict = 'done' THEN now()
                       WHEN o.status = 'cancelled' THEN o.finished_at
                       WHEN v.verdict = 'dead' THEN now() END,
       available_at = CASE
                        WHEN v.verdict = 'retry' AND o.status = 'pending'
                          THEN now() + v.delay_ms * interval '1 millisecond'
                        ELSE o.available_at END,
       attempts = o.attempts - CASE WHEN v.verdict = 'release' THEN 1 ELSE 0 END,
       lease_owner = NULL,
       leased_until = NULL,
       last_error = CASE
                      WHEN v.verdict = 'done' THEN NULL
                      WHEN v.verdict = 'release' THEN o.last_error
                      WHEN o.status = 'cancelled'
                        THEN o.last_error || '; the call under way then failed: ' || v.error
                      ELSE v.error END
  FROM unnest($1::int8[], $2::text[], $3::int8[], $4::text[], $5::int4[]) AS v(id, verdict, delay_ms, error, claim)
 -- The fence: still ours, under this very claim. Only an undecided row
 -- (pending, or cancelled while held) has an owner, and a primary-key plan
 -- whatever the statistics.
 WHERE o.id = v.id AND o.lease_owner = $6 AND o.claims = v.claim
RETURNING o.id, o.status, extract(epoch FROM now() - o.created_at)::float8 AS age_seconds
