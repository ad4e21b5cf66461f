-- One recorded event, whole (`events show`): $1 its id. The stored answer and
-- the event as delivered as text, for the caller to print as they are.
SELECT event_id, event_type, status, processed_at, last_delivered_at, deliveries, order_id,
       result::text AS result, payload::text AS payload, trace_context,
       discarded_reason, discarded_at
FROM public.processed_events
WHERE event_id = $1
