-- One outbox row, whole, for `dead show`: $1 its id. What it sends (the
-- payload, as text for the caller to print as it is), its state, its
-- attempts and claims, its last error, its times, who holds it, and the
-- trace it belongs to.
SELECT id, kind, idempotency_key, event_id, order_id, status, attempts, claims, last_error,
       payload::text AS payload, trace_context, created_at, available_at, finished_at,
       lease_owner, leased_until
  FROM public.outbox
 WHERE id = $1
