-- Applies an event recorded `unmatched` (no order had its payment id when it
-- arrived) to its order, now that the order exists: `webhook-ingest events
-- replay`. What it does to the order is what it would have done had the
-- order existed then, decided by the plan for the state the order is in now
-- (record_event.sql): a payment for a pending order pays it and enqueues its
-- shipment and confirmation; for an order paid meanwhile, nothing
-- (`already_paid`); a refund stops the shipment as a refund does. The steps
-- that apply it are record_event.sql's (`-- include:`, expanded by build.rs).
-- $1 event id, $2 its payment id, $3 the plan of its kind (JSON), $4 payload
-- version.
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
), params AS (
    -- The event as the steps name it.
    SELECT ev.event_id, ev.trace_context, $4::int4 AS payload_version
    FROM ev
), order_locked AS (
    SELECT orders.id, orders.status
    FROM public.orders AS orders, ev
    WHERE orders.payment_id = $2::text
    FOR UPDATE OF orders
), decision AS (
    SELECT order_locked.id AS order_id,
           $3::text::jsonb -> order_locked.status AS step
    FROM order_locked
), claim AS (
    -- The replay's claim: the event's row, `unmatched` no more.
    UPDATE public.processed_events AS pe
       SET status = decision.step ->> 'outcome',
           order_id = decision.order_id,
           result = jsonb_strip_nulls(jsonb_build_object(
               'event_id', pe.event_id,
               'status', decision.step ->> 'outcome',
               'order_id', decision.order_id))
      FROM params, decision
     WHERE pe.event_id = params.event_id
    RETURNING true AS claimed, pe.status, pe.result::text AS body, pe.order_id
-- include: steps/update_order.sql
-- include: steps/stop_shipment.sql
-- include: steps/enqueue.sql
)
SELECT claim.status, claim.body, claim.order_id,
       (SELECT count(*) FROM enqueued)::int4 AS enqueued
FROM claim
