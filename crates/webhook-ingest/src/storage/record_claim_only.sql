-- Claims an event whose outcome does not depend on any order and that changes
-- nothing (types we ignore): the claim alone, the order not even looked up.
-- A conflict is a later delivery: it counts, and returns the stored result.
-- Its own statement, not record_event.sql's: no order, no step, no lock.
--   $1  the event id
--   $2  its type
--   $3  its outcome (the status recorded)
--   $4  the event as delivered (stored as jsonb)
--   $5  W3C traceparent of the request
INSERT INTO public.processed_events AS pe (event_id, event_type, status, result, payload, trace_context)
VALUES ($1, $2, $3, jsonb_build_object('event_id', $1::text, 'status', $3::text), $4::text::jsonb, $5)
ON CONFLICT (event_id) DO UPDATE
    SET deliveries = pe.deliveries + 1, last_delivered_at = now()
RETURNING (pe.xmax = 0) AS claimed, pe.result::text AS body, pe.status, 0::int4 AS enqueued
