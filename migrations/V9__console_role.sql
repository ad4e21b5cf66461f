-- The operator's console (crates/ops-console) logs in as a member of
-- ops_console: it reads what its pages show (an event's story, an order,
-- the dead letters, the unmatched payments, the backlog) and runs three
-- actions with the services' own statements, guards included. It never
-- deletes, never inserts an order or an event, and never claims a row.
-- Created as in V2: when it exists already (an operator created it first,
-- deploy/sql/roles.sql), this only grants.

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ops_console') THEN
        BEGIN
            CREATE ROLE ops_console NOLOGIN;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'role ops_console does not exist and % may not create it', current_user
                    USING HINT = 'create it once as a user with CREATEROLE (deploy/sql/roles.sql), then run migrate again';
        END;
    END IF;
    IF NOT has_schema_privilege('ops_console', current_schema(), 'USAGE') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO ops_console', current_schema());
    END IF;
END
$$;

-- /readyz compares the applied migrations with its own.
GRANT SELECT (version) ON refinery_schema_history TO ops_console;

-- The pages: events whole (payload, stored answer, trace), orders, outbox
-- rows whole (what each sends, its errors, who holds it).
GRANT SELECT ON processed_events TO ops_console;
GRANT SELECT (id, payment_id, status, created_at, updated_at) ON orders TO ops_console;
GRANT SELECT ON outbox TO ops_console;

-- Requeue a dead letter (requeue_dead.sql) or discard it (discard_dead.sql).
GRANT UPDATE (status, available_at, attempts, lease_owner, leased_until, finished_at, last_error)
    ON outbox TO ops_console;

-- Replay an unmatched payment on its order (replay_event.sql: the ingest's
-- own apply steps, which change the order, stop an unsent shipment on a
-- refund and enqueue commands), or discard it (discard_event.sql).
GRANT UPDATE (status, updated_at) ON orders TO ops_console;
GRANT UPDATE (status, order_id, result, discarded_reason, discarded_at) ON processed_events TO ops_console;
GRANT INSERT (kind, payload, idempotency_key, event_id, order_id, trace_context, status, finished_at, last_error)
    ON outbox TO ops_console;
