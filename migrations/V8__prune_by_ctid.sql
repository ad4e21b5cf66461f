-- The relay's retention deletes processed events by the ctids its index scan
-- found (crates/outbox-relay/src/storage/prune_events.sql), not by probing
-- their primary key. Reading a row's ctid is a column privilege like any
-- other, and the relay's SELECT on processed_events names its columns; the
-- ctid says where a row is, nothing of what it holds. The event id is no
-- longer read by the relay, and a grant nothing uses is taken back.
GRANT SELECT (ctid) ON processed_events TO outbox_relay;
REVOKE SELECT (event_id) ON processed_events FROM outbox_relay;
