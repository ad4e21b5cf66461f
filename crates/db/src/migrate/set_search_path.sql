-- Sets this session's search_path to $1 (text) until it ends or is set
-- again: pg_catalog alone while the migration checks the schema, `public`
-- (with the implicit pg_catalog searched first) while the migrations create
-- their tables unqualified. Returns the value set.
SELECT pg_catalog.set_config('search_path', $1, false) AS search_path
