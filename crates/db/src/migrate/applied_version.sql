-- The newest migration version applied to this database (0 when none).
-- No parameters.
SELECT coalesce(max(version), 0)::int4 AS applied_version
FROM public.refinery_schema_history
