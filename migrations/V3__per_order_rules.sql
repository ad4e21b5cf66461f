-- Exactly once per ORDER, not only per idempotency key (README, Guarantees):
--
-- 1. A refund stops the order's shipment with an upsert on its key (see
--    crates/webhook-ingest/src/storage.rs): a row not yet sent, or dead,
--    becomes `cancelled`; when the order has no shipment row (retention
--    removed it), a `cancelled` one is written. The ingest therefore inserts
--    the status columns too.
-- 2. A shipment whose call is under way when the refund commits is cancelled
--    at once but keeps its lease: the lease holder may still record `done`
--    for THAT claim (the call succeeded), never anything that sends it again.
--    So a cancelled row may carry a lease until its holder records the call's
--    outcome (or forever, if the holder died: the lease then only says whose
--    outcome never came).
-- 3. The fencing token of a claim is (`lease_owner`, `claims`): `claims`
--    counts every claim of the row and, unlike `attempts` (which
--    `dead requeue` resets), never goes back, so a stale claim's outcome can
--    never match a later claim.

ALTER TABLE outbox ADD COLUMN claims integer NOT NULL DEFAULT 0;
COMMENT ON COLUMN outbox.claims IS
    'Claims of this row ever made; never reset. With lease_owner, the fencing token of a claim.';

ALTER TABLE outbox DROP CONSTRAINT outbox_lease_only_when_pending;
ALTER TABLE outbox ADD CONSTRAINT outbox_lease_only_while_undecided
    CHECK (lease_owner IS NULL OR status IN ('pending', 'cancelled'));

-- webhook-ingest: the refund's upsert of the shipment row. It no longer
-- touches leases (a refund never takes a lease away from its holder).
-- It matches the shipment on its key alone and reads only its status.
GRANT INSERT (status, finished_at, last_error) ON outbox TO webhook_ingest;
REVOKE UPDATE (lease_owner, leased_until) ON outbox FROM webhook_ingest;
REVOKE SELECT (id, leased_until) ON outbox FROM webhook_ingest;

-- outbox-relay: the claim counts claims.
GRANT UPDATE (claims) ON outbox TO outbox_relay;
