-- `webhook-ingest events discard <id> --reason ...`: an operator decides an
-- `unmatched` event will never match (a test payment, another shop's, an
-- order cancelled before it was written). Its status becomes `discarded`,
-- with the reason and the time; the row stays (retention keeps it: the
-- audit of the decision) and its stored answer is left as the provider got
-- it. Only while it is still `unmatched`: a racing replay or reconciler
-- either applied it first (nothing discarded) or waits for this row's lock
-- and then finds it no longer `unmatched` (nothing applied).
-- $1 event id, $2 the reason. Returns the row if it discarded it.
UPDATE public.processed_events
   SET status = 'discarded', discarded_reason = $2, discarded_at = now()
 WHERE event_id = $1 AND status = 'unmatched'
RETURNING event_id, discarded_at
