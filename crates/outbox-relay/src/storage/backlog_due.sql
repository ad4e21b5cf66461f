-- Rows due now (pending, due and not leased), counted up to 100000 along the
-- due index (a larger backlog reads 100000): what `stats` and the console
-- show beside the gauges. Apart from `backlog.sql` because no gauge shows it
-- and each row it counts is read from the heap (its lease is not in the
-- index): in the gauges it was half their cost over a backlog, on every
-- relay every 5 s. Not `sql/count_due.sql`, the autoscaler's: that one counts
-- every due row, however many. No parameters.
SELECT count(*) AS due FROM (
  SELECT 1 FROM public.outbox
   WHERE status = 'pending' AND available_at <= now()
     AND (leased_until IS NULL OR leased_until <= now())
   ORDER BY available_at, id LIMIT 100000
) AS due
