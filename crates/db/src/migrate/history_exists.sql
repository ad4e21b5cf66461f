-- Whether refinery's history table exists: if not, no migration ever ran
-- (and reading it would fail).
-- $1: the history table's schema-qualified name (text).
SELECT pg_catalog.to_regclass($1) IS NOT NULL AS history_exists
