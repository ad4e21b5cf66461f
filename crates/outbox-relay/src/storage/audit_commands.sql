-- Outbox rows created in the last $1 seconds, by kind and status.
SELECT kind, status, count(*) AS row_count
  FROM public.outbox
 WHERE created_at >= now() - $1 * interval '1 second'
 GROUP BY kind, status
 ORDER BY kind, status
