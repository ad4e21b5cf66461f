-- The backlog gauges: rows pending, the oldest pending row's age (0 when
-- none), rows dead, and rows due now (pending, due, not leased). Served by the
-- partial indexes: cheap at any size of history. No parameters.
SELECT count(*) AS pending,
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_pending_age_seconds,
       (SELECT count(*) FROM outbox WHERE status = 'dead') AS dead,
       count(*) FILTER (WHERE available_at <= now() AND (leased_until IS NULL OR leased_until <= now())) AS due
  FROM outbox WHERE status = 'pending'
