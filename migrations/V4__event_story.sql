-- `webhook-ingest events show <id>`: one event's whole story for an
-- operator, run as the ingest is deployed (its own DATABASE_URL). Beside the
-- event's row, the commands of its order, found by their idempotency keys
-- (the unique index: no scan by event), with their state, attempts, last
-- error, times and lease holder: the columns granted here. Still not what a
-- command sends (payload, trace context: the relay's), and nothing written.
GRANT SELECT (id, kind, event_id, attempts, last_error, created_at, available_at, finished_at,
               lease_owner, leased_until)
    ON outbox TO webhook_ingest;
