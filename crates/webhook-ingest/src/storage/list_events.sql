-- Recorded events, newest first: those of status $1 (all when NULL), at most $2.
SELECT event_id, event_type, status, processed_at, deliveries, order_id, payload
FROM public.processed_events
WHERE $1::text IS NULL OR status = $1
ORDER BY processed_at DESC, event_id
LIMIT $2
