-- `dead discard`: a dead row ended as `cancelled` by an operator, kept (for
-- the audit, until retention) with why: `last_error` becomes the
-- operator's reason and the error it died of. $1 the row's id, $2 the reason.
-- Only a dead row: returns nothing for any other (changed by nobody).
UPDATE public.outbox
   SET status = 'cancelled', finished_at = now(),
       last_error = 'discarded by an operator: ' || $2::text
                    || coalesce(' (it died of: ' || last_error || ')', '')
 WHERE id = $1 AND status = 'dead'
RETURNING id, kind, idempotency_key, event_id, order_id, attempts, last_error
