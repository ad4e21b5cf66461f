-- Payments that arrive before their orders (docs/CONTRACT.md, "Payments
-- before their orders"). The provider got a 200 for an `unmatched` event and
-- will not send it again, so its row is the only copy of money received:
-- - the ingest applies it by itself once an order has its payment id
--   (crates/webhook-ingest/src/reconcile.rs, through replay_event.sql: the
--   UPDATE of status, order_id and result granted in V5);
-- - retention never deletes it (prune_events.sql keeps `unmatched` and
--   `discarded` rows whatever their age);
-- - one that will never match is discarded by an operator with a reason
--   (`webhook-ingest events discard <id> --reason ...`): its status becomes
--   `discarded`, and the row stays, with the reason and the time, as the
--   audit of that decision. Its stored answer is left as the provider got it.
ALTER TABLE processed_events
    ADD COLUMN discarded_reason text,
    ADD COLUMN discarded_at     timestamptz;
GRANT UPDATE (discarded_reason, discarded_at) ON processed_events TO webhook_ingest;
