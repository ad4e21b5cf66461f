-- Outbox rows created in the window ($1 seconds back from the database's
-- clock, NULL for no window), by kind and status.
SELECT kind,
       status,
       count(*) AS commands
FROM public.outbox
WHERE $1::float8 IS NULL
   OR created_at >= now() - make_interval(secs => $1::float8)
GROUP BY kind, status
ORDER BY kind, status
