-- Events first processed in the window ($1 seconds back from the database's
-- clock, NULL for no window), by recorded status, with their deliveries:
-- every delivery that reached the ingest, duplicates included.
SELECT status,
       count(*) AS events,
       sum(deliveries)::int8 AS deliveries
FROM public.processed_events
WHERE $1::float8 IS NULL
   OR processed_at >= now() - make_interval(secs => $1::float8)
GROUP BY status
ORDER BY status
