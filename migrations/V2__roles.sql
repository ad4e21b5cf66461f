-- Least privilege: a group role per service, granted exactly what its SQL
-- does (crates/webhook-ingest/src/storage.rs, crates/outbox-relay/src/storage.rs)
-- and nothing else. The services log in as LOGIN users that are members of
-- these groups and own nothing; the user running `webhook-ingest migrate`
-- owns the tables (it created them in V1), which is what lets it GRANT, and
-- is the only one that can change the schema. deploy/sql/roles.sql shows an
-- operator how to create the login users.
--
--   webhook_ingest   claims events, changes orders, enqueues and cancels commands
--   outbox_relay     leases, completes and prunes outbox rows; reads events for `audit`
--   outbox_monitor   counts due rows (the KEDA trigger), reads nothing else
--
-- Roles are cluster-wide, grants are per database: this file must work when
-- the roles already exist (another database of the cluster, an operator who
-- created them beforehand) and when another database's migration creates
-- them at the same moment. The migrating user needs CREATEROLE only when the
-- roles do not exist yet; on a managed database where it has none, the
-- operator creates them first and this migration only grants.

DO $$
DECLARE
    role_name text;
    missing text[] := '{}';
BEGIN
    FOREACH role_name IN ARRAY ARRAY['webhook_ingest', 'outbox_relay', 'outbox_monitor'] LOOP
        CONTINUE WHEN EXISTS (SELECT FROM pg_roles WHERE rolname = role_name);
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', role_name);
        EXCEPTION
            -- Created by a concurrent migration of another database.
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN missing := missing || role_name;
        END;
    END LOOP;
    IF cardinality(missing) > 0 THEN
        RAISE EXCEPTION 'roles % do not exist and % may not create them', missing, current_user
            USING HINT = 'create them once as a user with CREATEROLE (deploy/sql/roles.sql), then run migrate again';
    END IF;
END
$$;

-- PUBLIC has USAGE on `public` already; a schema of the operator's own may not.
DO $$
BEGIN
    IF NOT has_schema_privilege('webhook_ingest', current_schema(), 'USAGE')
       OR NOT has_schema_privilege('outbox_relay', current_schema(), 'USAGE')
       OR NOT has_schema_privilege('outbox_monitor', current_schema(), 'USAGE') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO webhook_ingest, outbox_relay, outbox_monitor',
                       current_schema());
    END IF;
END
$$;

-- Both services compare the applied migrations with their own (/readyz).
GRANT SELECT (version) ON refinery_schema_history TO webhook_ingest, outbox_relay;

-- webhook-ingest: record_event, and `events list`.
--   orders: lock the order by payment_id (FOR UPDATE needs UPDATE on a
--   column) and set its status. No INSERT, no DELETE: the shop owns orders.
GRANT SELECT (id, payment_id, status) ON orders TO webhook_ingest;
GRANT UPDATE (status, updated_at) ON orders TO webhook_ingest;
--   processed_events: claim (INSERT), count a duplicate delivery (the
--   ON CONFLICT update), replay the stored result. Whole-table SELECT: the
--   claim reads the system column xmax, which no column grant covers.
GRANT SELECT ON processed_events TO webhook_ingest;
GRANT INSERT (event_id, event_type, status, order_id, result, payload, trace_context)
    ON processed_events TO webhook_ingest;
GRANT UPDATE (deliveries, last_delivered_at) ON processed_events TO webhook_ingest;
--   outbox: enqueue commands; on a refund, cancel the order's unleased
--   shipment. It reads only what it matches that shipment on, never
--   payloads or errors, and writes none of the relay's columns but the
--   cancellation's. The id comes from the identity column's sequence, which
--   needs no grant of its own (identity defaults skip the sequence check).
GRANT INSERT (kind, payload, idempotency_key, event_id, order_id, trace_context)
    ON outbox TO webhook_ingest;
GRANT SELECT (id, idempotency_key, status, leased_until) ON outbox TO webhook_ingest;
GRANT UPDATE (status, finished_at, lease_owner, leased_until, last_error) ON outbox TO webhook_ingest;

-- outbox-relay: claim under a lease, record outcomes, requeue dead rows,
-- stats, prune, audit. Never inserts a command, never rewrites one (kind,
-- payload, idempotency key are the ingest's), never touches orders.
GRANT SELECT ON outbox TO outbox_relay;
GRANT UPDATE (status, attempts, available_at, lease_owner, leased_until, last_error, finished_at)
    ON outbox TO outbox_relay;
GRANT DELETE ON outbox TO outbox_relay;
--   processed_events: retention (DELETE) and the audit's counts. Not the
--   payloads or stored results: the relay has no use for them.
GRANT SELECT (event_id, status, processed_at, deliveries) ON processed_events TO outbox_relay;
GRANT DELETE ON processed_events TO outbox_relay;

-- outbox_monitor: crates/outbox-relay/sql/count_due.sql, nothing more.
GRANT SELECT (status, available_at, leased_until) ON outbox TO outbox_monitor;
