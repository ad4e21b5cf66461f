-- Events recorded `unmatched`, oldest first, each with the order that has
-- its payment id now (NULL: none yet), for the console's list of payments
-- no order matched. Walks the partial index of unmatched events
-- (processed_events_unmatched_idx): its cost is the unmatched events, never
-- the table. $1, $2 the page's start: after this first delivery and event
-- id (NULL: from the oldest); $3 at most this many; $4 only this payment id
-- (NULL: any).
SELECT pe.event_id, pe.event_type, pe.processed_at, pe.deliveries,
       pe.payload -> 'data' ->> 'payment_id' AS payment_id,
       orders.id AS order_id,
       extract(epoch FROM now() - pe.processed_at)::float8 AS age_seconds
  FROM public.processed_events AS pe
  LEFT JOIN public.orders AS orders ON orders.payment_id = pe.payload -> 'data' ->> 'payment_id'
 WHERE pe.status = 'unmatched'
   AND ($1::timestamptz IS NULL OR (pe.processed_at, pe.event_id) > ($1::timestamptz, $2::text))
   AND ($4::text IS NULL OR pe.payload -> 'data' ->> 'payment_id' = $4::text)
 ORDER BY pe.processed_at, pe.event_id
 LIMIT $3
