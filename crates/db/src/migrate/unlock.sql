-- Releases the migration lock taken by lock.sql; false if this session did
-- not hold it.
-- $1: the lock's key (int8).
SELECT pg_catalog.pg_advisory_unlock($1)
