-- Takes the migration lock, waiting while another session holds it, so that
-- one session migrates at a time. A session lock: it holds across the
-- migration's transactions until unlock.sql or the session's end.
-- $1: the lock's key (int8).
SELECT pg_catalog.pg_advisory_lock($1)
