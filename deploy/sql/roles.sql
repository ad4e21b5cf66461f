-- The database, its owner and the services' login users, for an operator to
-- run once per environment as an administrator (a role with CREATEROLE and
-- CREATEDB; on a managed service, its admin user), before the first
-- `webhook-ingest migrate`:
--
--   psql "postgres://ADMIN@HOST:5432/postgres?sslmode=verify-full&sslrootcert=ca.pem" \
--     -v owner_password="$OWNER_PASSWORD" -v ingest_password="$INGEST_PASSWORD" \
--     -v relay_password="$RELAY_PASSWORD" -v monitor_password="$MONITOR_PASSWORD" \
--     -f deploy/sql/roles.sql                    # optional: -v dbname=webhooks
--
-- and with the operator's console (opt-in, deploy/README.md), also
-- -v console_password="$CONSOLE_PASSWORD" for its login.
--
-- Running it again is safe: what exists is left as it is (passwords
-- included: change them with ALTER ROLE), the role settings are set again.
--
-- Who is who (migrations/V2__roles.sql holds the grants):
--   webhooks_owner  runs `webhook-ingest migrate` (over a direct connection:
--                   the migration holds a session lock), owns the tables, and
--                   so is the one role that can change the schema or GRANT.
--                   Needs no CREATEROLE once the groups below exist.
--   ingest_app      DATABASE_URL of webhook-ingest; member of webhook_ingest.
--   relay_app       DATABASE_URL (and RELAY_LISTEN_DATABASE_URL) of
--                   outbox-relay and its operator commands; member of outbox_relay.
--   keda_app        the KEDA trigger's connection; member of outbox_monitor.
--   console_app     DATABASE_URL of ops-console, the operator's console;
--                   member of ops_console (migrations/V9__console_role.sql:
--                   what its pages read and its three actions write). Made
--                   only when -v console_password is given: the console is
--                   opt-in, and a login nobody uses is one password too many.
--                   The group is made either way (the migration grants to it).
-- The login users own nothing and hold nothing but their group's grants:
-- least privilege is the groups', and a leaked service password cannot
-- drop, rewrite or read beyond what that service does.
--
-- On a managed service whose admin is not a superuser, CREATE DATABASE ...
-- OWNER needs the admin to be a member of the owner: GRANT webhooks_owner TO
-- <admin> first.

\set ON_ERROR_STOP on
\if :{?dbname}
\else
\set dbname webhooks
\endif

-- The groups the migration grants to. The migration creates them itself when
-- its user may (CREATEROLE); creating them here lets the owner do without.
SELECT format('CREATE ROLE %I NOLOGIN', name)
  FROM unnest(ARRAY['webhook_ingest', 'outbox_relay', 'outbox_monitor', 'ops_console']) AS name
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = name)
\gexec

-- The schema owner: no CREATEROLE, no CREATEDB, no superuser.
SELECT format('CREATE ROLE webhooks_owner LOGIN PASSWORD %L', :'owner_password')
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'webhooks_owner')
\gexec

-- The services' login users, each in its group.
SELECT format('CREATE ROLE %I LOGIN PASSWORD %L IN ROLE %I', login, password, grp)
  FROM (VALUES ('ingest_app', :'ingest_password', 'webhook_ingest'),
               ('relay_app', :'relay_password', 'outbox_relay'),
               ('keda_app', :'monitor_password', 'outbox_monitor')) AS u(login, password, grp)
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = login)
\gexec
-- Users that existed before this script: make sure of the membership.
SELECT format('GRANT %I TO %I', grp, login)
  FROM (VALUES ('ingest_app', 'webhook_ingest'), ('relay_app', 'outbox_relay'),
               ('keda_app', 'outbox_monitor')) AS u(login, grp)
 WHERE NOT pg_has_role(login, grp, 'MEMBER')
\gexec
-- The console's login, in the same way, when its password is given.
\if :{?console_password}
SELECT format('CREATE ROLE %I LOGIN PASSWORD %L IN ROLE %I', login, password, grp)
  FROM (VALUES ('console_app', :'console_password', 'ops_console')) AS u(login, password, grp)
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = login)
\gexec
SELECT 'GRANT ops_console TO console_app'
 WHERE NOT pg_has_role('console_app', 'ops_console', 'MEMBER')
\gexec
\endif

-- Settings carried by the login role. With DATABASE_POOL_MODE=session the
-- services set the same per connection (startup options); through a
-- transaction-mode pooler, which passes no startup options, these are what
-- bounds every statement. Keep them in step with the services' settings.
--   every login: names resolve in pg_catalog alone. PostgreSQL resolves a
--   function or operator across the whole search_path by best match of the
--   argument types, so on the default path ("$user", public) a function
--   someone created in `public` with exact types (PostgreSQL 14 and earlier
--   let every role create there) would run inside our statements, as us.
--   The services' statements name their tables (public.outbox); behind a
--   transaction-mode pooler /readyz answers 503 until this is set.
ALTER ROLE ingest_app SET search_path = pg_catalog;
ALTER ROLE relay_app SET search_path = pg_catalog;
ALTER ROLE keda_app SET search_path = pg_catalog;
--   the ingest: its whole handler has INGEST_DEADLINE_MS (5 s); a statement
--   whose client gave up is cancelled instead of committing later.
ALTER ROLE ingest_app SET statement_timeout = '5s';
--   a delivery whose order is locked for long (by the shop, or a slow
--   delivery) gives its connection back and tries again (the ingest sets a
--   twentieth of INGEST_DEADLINE_MS, at most 100 ms): without it, such a
--   delivery waits on its connection, and a few of them can take the pool
--   from every other order.
ALTER ROLE ingest_app SET lock_timeout = '100ms';
ALTER ROLE ingest_app SET client_connection_check_interval = '250ms';
--   the relay: leases and outcomes may be lost in a server crash without harm
--   (a row is sent again under the same idempotency key), so its commits do
--   not wait for the WAL flush.
ALTER ROLE relay_app SET statement_timeout = '30s';
ALTER ROLE relay_app SET synchronous_commit = off;
--   both services reach every row by a key or an index: a plan made while a
--   table was new (never analyzed, costed as ten pages) would otherwise
--   scan or hash it whole, and a cached plan keeps doing so as it grows
--   (docs/ARCHITECTURE.md, "Plans that do not depend on statistics").
ALTER ROLE ingest_app SET enable_seqscan = off;
ALTER ROLE ingest_app SET enable_hashjoin = off;
ALTER ROLE ingest_app SET enable_mergejoin = off;
ALTER ROLE relay_app SET enable_seqscan = off;
ALTER ROLE relay_app SET enable_hashjoin = off;
ALTER ROLE relay_app SET enable_mergejoin = off;
--   the relay's prune: it compresses the full-page images of its WAL (most
--   of what deleting old rows writes, which the ingest's commits wait
--   behind) when its group may set wal_compression: PostgreSQL 15 and later,
--   granted by a superuser. Without it the prune runs uncompressed, or
--   with the server's own wal_compression (setting that is as good).
SELECT 'GRANT SET ON PARAMETER wal_compression TO outbox_relay'
 WHERE current_setting('server_version_num')::int >= 150000
   AND (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
\gexec
--   the autoscaler: one count, read-only.
ALTER ROLE keda_app SET statement_timeout = '5s';
ALTER ROLE keda_app SET default_transaction_read_only = on;
--   the console, where its login was made: its pages' reads and its
--   actions, each bounded as the console bounds it per session.
\if :{?console_password}
ALTER ROLE console_app SET search_path = pg_catalog;
ALTER ROLE console_app SET statement_timeout = '10s';
\endif

-- The database, owned by the schema owner.
SELECT format('CREATE DATABASE %I OWNER webhooks_owner', :'dbname')
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'dbname')
\gexec

\connect :"dbname"
-- Before PostgreSQL 15 every role may create tables in `public`: not the
-- services. (Since 15 this is the default; the statement changes nothing.)
-- `webhook-ingest migrate` refuses to run while PUBLIC (or any role but the
-- schema's owner, the migrating user and superusers) may create there.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
