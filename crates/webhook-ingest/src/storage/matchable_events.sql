-- Events recorded `unmatched` whose payment id an order now has: what the
-- reconciler applies (crate::reconcile, through replay_event.sql), oldest
-- first, so an order's early events apply in the order the provider sent
-- them. Only those first delivered since $1: the reconciler looks at young
-- events every second and at all of them up to the provider's retry horizon
-- every minute. Walks the partial index of unmatched events
-- (processed_events_unmatched_idx) and probes the orders' unique payment id:
-- its cost is the unmatched events in the window, never the table.
-- $1 the oldest first delivery to look at, $2 at most this many.
SELECT pe.event_id, pe.payload::text AS payload
FROM public.processed_events AS pe
JOIN public.orders AS orders ON orders.payment_id = pe.payload -> 'data' ->> 'payment_id'
WHERE pe.status = 'unmatched' AND pe.processed_at >= $1
ORDER BY pe.processed_at, pe.event_id
LIMIT $2
