-- The backlog gauges, each read from a partial index and bounded, whatever
-- the backlog: rows pending are counted up to 100000 (a larger backlog reads
-- 100000); the age is that of the pending row next in line (earliest due,
-- the first entry of the due index), 0 when none; rows dead are few. Every
-- relay runs it every 5 s: what only `stats` and the console show, the rows
-- due now, is `backlog_due.sql`. No parameters.
WITH pending AS (
  SELECT 1 FROM public.outbox WHERE status = 'pending'
   ORDER BY available_at, id LIMIT 100000
), next_in_line AS (
  SELECT created_at FROM public.outbox WHERE status = 'pending'
   ORDER BY available_at, id LIMIT 1
)
SELECT (SELECT count(*) FROM pending) AS pending,
       coalesce((SELECT extract(epoch FROM now() - created_at) FROM next_in_line), 0)::float8
         AS oldest_pending_age_seconds,
       (SELECT count(*) FROM public.outbox WHERE status = 'dead') AS dead
