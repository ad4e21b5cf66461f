-- Events first processed in the last $1 seconds: how many, and how many
-- deliveries of them were received.
SELECT count(*) AS distinct_events, coalesce(sum(deliveries), 0)::int8 AS deliveries
  FROM public.processed_events
 WHERE processed_at >= now() - $1 * interval '1 second'
