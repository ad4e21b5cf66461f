-- Applies an event recorded `unmatched` (no order had its payment id when it
-- arrived) to its order, now that the order exists: `webhook-ingest events
-- replay`. What it does to the order is what it would have done had the
-- order existed then, decided by the plan for the state the order is in now
-- (record_event.sql): a payment for a pending order pays it and enqueues its
-- shipment and confirmation; for an order paid meanwhile, nothing
-- (`already_paid`); a refund stops the shipment as a refund does.
-- $1 event id, $2 its payment id, $3 the plan of its kind (JSON), $4 payload
-- version, $5 the shipment's kind, $6 its key prefix.
--
-- At most once, however many replays race it and whatever deliveries of the
-- id arrive meanwhile: the event's row is locked (FOR UPDATE) and changed
-- only while it is still `unmatched`; a concurrent replay waits for that
-- lock, then finds the row changed and does nothing. The order is locked
-- too, as every event of the order locks it, so the replay applies in the
-- order's commit order like any delivery. The event's stored answer becomes
-- the replayed outcome: later deliveries of the id are answered with it.
-- Returns one row if it applied the event, none otherwise.
WITH ev AS (
    SELECT pe.event_id, pe.trace_context
    FROM public.processed_events AS pe
    WHERE pe.event_id = $1 AND pe.status = 'unmatched'
    FOR UPDATE
), order_locked AS (
    SELECT orders.id, orders.status
    FROM public.orders AS orders, ev
    WHERE orders.payment_id = $2::text
    FOR UPDATE OF orders
), decision AS (
    SELECT ev.event_id, ev.trace_context, order_locked.id AS order_id,
           $3::text::jsonb -> order_locked.status AS step
    FROM ev, order_locked
), applied AS (
    UPDATE public.processed_events AS pe
       SET status = decision.step ->> 'outcome',
           order_id = decision.order_id,
           result = jsonb_strip_nulls(jsonb_build_object(
               'event_id', pe.event_id,
               'status', decision.step ->> 'outcome',
               'order_id', decision.order_id))
      FROM decision
     WHERE pe.event_id = decision.event_id
    RETURNING pe.status, pe.result::text AS body, pe.order_id
), order_update AS (
    UPDATE public.orders AS orders SET status = decision.step ->> 'set_status', updated_at = now()
    FROM decision, applied
    WHERE orders.id = decision.order_id AND decision.step ->> 'set_status' IS NOT NULL
), stopped AS (
    -- As record_event_stopping_shipment.sql: a row not yet sent (or dead) is
    -- cancelled, one under way keeps its lease, a done one stays done.
    INSERT INTO public.outbox AS o (kind, payload, idempotency_key, event_id, order_id, trace_context,
                             status, finished_at, last_error)
    SELECT $5::text,
           jsonb_build_object('v', $4::int4, 'order_id', decision.order_id, 'event_id', decision.event_id),
           $6::text || '-' || decision.order_id,
           decision.event_id, decision.order_id, decision.trace_context,
           'cancelled', now(), 'no shipment to stop: retention had removed it; refund ' || decision.event_id
    FROM decision, applied
    WHERE (decision.step ->> 'stop_shipment')::bool
    ON CONFLICT (idempotency_key) DO UPDATE
        SET status = 'cancelled', finished_at = now(), last_error = 'cancelled by ' || $1
        WHERE o.status IN ('pending', 'dead')
), enqueued AS (
    INSERT INTO public.outbox (kind, payload, idempotency_key, event_id, order_id, trace_context)
    SELECT command.spec ->> 'kind',
           jsonb_build_object('v', $4::int4, 'order_id', decision.order_id, 'event_id', decision.event_id),
           (command.spec ->> 'key_prefix') || '-' || decision.order_id,
           decision.event_id, decision.order_id, decision.trace_context
    FROM decision, applied,
         jsonb_array_elements(decision.step -> 'enqueue') WITH ORDINALITY AS command(spec, position)
    ORDER BY command.position
    -- One effect per order and kind, whatever the number of events.
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING 1
)
SELECT applied.status, applied.body, applied.order_id,
       (SELECT count(*) FROM enqueued)::int4 AS enqueued
FROM applied
