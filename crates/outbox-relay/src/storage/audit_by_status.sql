-- Events first processed in the last $1 seconds, by recorded status.
SELECT status, count(*) AS events
  FROM public.processed_events
 WHERE processed_at >= now() - $1 * interval '1 second'
 GROUP BY status
 ORDER BY status
