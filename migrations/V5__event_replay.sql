-- `webhook-ingest events replay <id>`: an event recorded `unmatched` is
-- applied to its order once the order exists (storage/replay_event.sql): its
-- row takes the outcome, the order and the answer later deliveries get.
GRANT UPDATE (status, order_id, result) ON processed_events TO webhook_ingest;
