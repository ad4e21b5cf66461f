-- Rows by status and kind, for `stats`. No parameters.
SELECT status, kind, count(*) AS row_count
  FROM outbox
 GROUP BY status, kind
 ORDER BY status, kind
