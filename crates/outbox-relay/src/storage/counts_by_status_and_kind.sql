-- Rows by status and kind, for `stats`. No parameters.
SELECT status, kind, count(*) AS row_count
  FROM public.outbox
 GROUP BY status, kind
 ORDER BY status, kind
