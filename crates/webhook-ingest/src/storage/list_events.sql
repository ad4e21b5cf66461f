-- Recorded events, newest first (`events list`), each filter applied when not
-- NULL: status $1; id exactly $2, or starting with $3; processed within the
-- last $4 seconds; after the event $5 in this order (the next page: older,
-- or as old with a greater id); at most $6.
WITH page AS (
    SELECT processed_at, event_id FROM public.processed_events WHERE event_id = $5
)
SELECT pe.event_id, pe.event_type, pe.status, pe.processed_at, pe.deliveries, pe.order_id, pe.payload
FROM public.processed_events AS pe
WHERE ($1::text IS NULL OR pe.status = $1)
  AND ($2::text IS NULL OR pe.event_id = $2)
  AND ($3::text IS NULL OR starts_with(pe.event_id, $3))
  AND ($4::float8 IS NULL OR pe.processed_at >= now() - $4 * interval '1 second')
  AND ($5::text IS NULL OR EXISTS (
        SELECT FROM page
        WHERE pe.processed_at < page.processed_at
           OR (pe.processed_at = page.processed_at AND pe.event_id > page.event_id)))
ORDER BY pe.processed_at DESC, pe.event_id
LIMIT $6
