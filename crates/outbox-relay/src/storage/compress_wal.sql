-- Compresses the full-page images in this session's WAL records with method
-- $1 (lz4, else pglz): the prune's deletes write one for nearly every page
-- they are the first to touch after a checkpoint, most of the WAL a prune
-- writes, which the ingest's commits then wait behind. Setting
-- wal_compression needs the right to (a superuser's, or on PostgreSQL 15
-- and later `GRANT SET ON PARAMETER wal_compression TO outbox_relay`,
-- deploy/sql/roles.sql); without it this fails, and the prune runs with the
-- server's setting. Returns the method now in force.
SELECT set_config('wal_compression', $1, false) AS wal_compression
