-- Per order, its first processed payment and its first refund, in unix
-- microseconds (the downstream records calls in the same unit), and whether a
-- payment was processed within the window: $1 seconds back from the
-- database's clock, NULL for no window. Only events that changed the order
-- count: a payment `processed`, a refund `refunded`.
SELECT order_id,
       event_type,
       (extract(epoch FROM min(processed_at)) * 1000000)::bigint AS first_processed_us,
       bool_or($1::float8 IS NULL
               OR processed_at >= now() - make_interval(secs => $1::float8)) AS in_window
FROM public.processed_events
WHERE order_id IS NOT NULL
  AND ((event_type = 'payment.succeeded' AND status = 'processed')
       OR (event_type = 'payment.refunded' AND status = 'refunded'))
GROUP BY order_id, event_type
