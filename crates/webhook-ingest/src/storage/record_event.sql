-- Claims one event and applies it to its order, in one statement (one round
-- trip, one transaction): the ingest's work per webhook. Two statements are
-- built from this file (build.rs expands each `-- include:`): a payment's,
-- without the `(refunds)` step, and a refund's, with it, so that no statement
-- carries a step its events never take. See storage/mod.rs for the design.
WITH params AS NOT MATERIALIZED (
    SELECT $1::text AS event_id,
           $2::text AS event_type,
           $3::text AS payment_id,
           -- What the event does to its order, for each state the order may
           -- be in: an object keyed by the state's name, `no_order` when no
           -- order has the payment id. Each entry is
           -- {"outcome": text, "set_status": text or null,
           --  "enqueue": [{"kind": text, "key_prefix": text}, ...],
           --  "stop_shipment": {"kind": text, "key_prefix": text}}
           $4::text::jsonb AS plan,
           -- The event as delivered, kept to reconcile unmatched events.
           $5::text::jsonb AS body,
           -- W3C traceparent of the request: the outbox rows join its trace.
           $6::text AS trace_context,
           -- Version of the outbox payload written.
           $7::int4 AS payload_version
), replayed AS (
    -- A later delivery of an id already claimed: it counts, and returns the
    -- stored result to replay. It never looks at the order, let alone locks
    -- it, so a redelivery storm for an order someone holds locked is
    -- answered at once and ties up no connection. An id whose row a
    -- concurrent prune removes updates nothing here, and is processed as new
    -- (a resend after retention).
    UPDATE public.processed_events AS pe
    SET deliveries = pe.deliveries + 1, last_delivered_at = now()
    FROM params
    WHERE pe.event_id = params.event_id
    RETURNING pe.result::text AS body, pe.status
), order_locked AS (
    -- The event's order, if any, locked, unless this is a later delivery:
    -- concurrent events for one order serialise here, so each sees the state
    -- the previous one left. A lock held for long is not waited out on this
    -- connection: the session's `lock_timeout` ends the statement, and the
    -- ingest tries again without holding a connection (http.rs).
    SELECT orders.id, orders.status
    FROM public.orders AS orders, params
    WHERE orders.payment_id = params.payment_id
      AND NOT EXISTS (SELECT FROM replayed)
    FOR UPDATE OF orders
), decision AS (
    -- Exactly one row, with or without an order: the plan's entry for the
    -- state the order was found in.
    SELECT order_locked.id AS order_id,
           params.plan -> coalesce(order_locked.status, 'no_order') AS step
    FROM params LEFT JOIN order_locked ON true
), claim AS (
    -- The event id claimed by inserting it: an atomic test-and-set on the
    -- primary key. A conflict is a delivery that raced the first one (its
    -- claim was not yet committed when `replayed` looked): it counts, and
    -- returns the stored result to replay.
    INSERT INTO public.processed_events AS pe
        (event_id, event_type, status, order_id, result, payload, trace_context)
    SELECT params.event_id, params.event_type, decision.step ->> 'outcome', decision.order_id,
           jsonb_strip_nulls(jsonb_build_object(
               'event_id', params.event_id,
               'status', decision.step ->> 'outcome',
               'order_id', decision.order_id)),
           params.body, params.trace_context
    FROM params, decision
    WHERE NOT EXISTS (SELECT FROM replayed)
    ON CONFLICT (event_id) DO UPDATE
        SET deliveries = pe.deliveries + 1, last_delivered_at = now()
    RETURNING (pe.xmax = 0) AS claimed, pe.result::text AS body, pe.status
-- include: steps/update_order.sql
-- include (refunds): steps/stop_shipment.sql
-- include: steps/enqueue.sql
)
SELECT claim.claimed, claim.body, claim.status,
       (SELECT count(*) FROM enqueued)::int4 AS enqueued
FROM claim
UNION ALL
SELECT false, replayed.body, replayed.status, 0
FROM replayed
