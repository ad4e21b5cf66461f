-- Claims several events and applies each to its order, in one statement (one
-- round trip, one transaction, one commit): record_event.sql for a batch of
-- payments that arrived together (see batch.rs). The batch never holds two
-- events of one id or of one payment id, so no event of it can depend on
-- another. Each event is answered from its own row, keyed by `n`, its place
-- in the arrays; an event with no row was not claimed (its order was locked
-- by someone else) and is recorded on its own, by record_event.sql.
-- Its own statement, not record_event.sql's steps: every step here joins its
-- event by `n` and skips locked orders, which a single event's steps do not.
WITH params AS MATERIALIZED (
    SELECT p.n::int4 AS n, p.event_id, p.event_type, p.payment_id,
           -- What the event does to its order, for each state (record_event.sql).
           p.plan::jsonb AS plan,
           -- The event as delivered, kept to reconcile unmatched events.
           p.body::jsonb AS body,
           -- W3C traceparent of the request: the outbox rows join its trace.
           p.trace_context
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
         WITH ORDINALITY AS p(event_id, event_type, payment_id, plan, body, trace_context, n)
), replayed AS (
    -- Later deliveries of ids already claimed: they count, and return the
    -- stored result to replay, never looking at their orders.
    UPDATE public.processed_events AS pe
    SET deliveries = pe.deliveries + 1, last_delivered_at = now()
    FROM params
    WHERE pe.event_id = params.event_id
    RETURNING params.n, pe.result::text AS body, pe.status
), fresh AS MATERIALIZED (
    SELECT params.* FROM params
    WHERE params.n NOT IN (SELECT replayed.n FROM replayed)
), order_locked AS (
    -- The events' orders, locked in the order of their ids (so two batches
    -- never wait for each other's), SKIPPING any that someone else holds:
    -- a batch never waits for an order's lock, and never holds its other
    -- events' orders while it waits. The statement's snapshot is not used
    -- to decide: FOR UPDATE reads each order's latest committed state.
    SELECT fresh.n, orders.id, orders.status
    FROM public.orders AS orders JOIN fresh ON orders.payment_id = fresh.payment_id
    ORDER BY orders.id
    FOR UPDATE OF orders SKIP LOCKED
), decision AS (
    -- One row per event to claim: the plan's entry for the state its order
    -- was found in. An event whose order exists but was skipped (locked) has
    -- no row here, and is neither claimed nor answered.
    SELECT fresh.n, order_locked.id AS order_id,
           fresh.plan -> coalesce(order_locked.status, 'no_order') AS step
    FROM fresh LEFT JOIN order_locked ON order_locked.n = fresh.n
    -- OFFSET 0: a probe of the payment id's index per event, never a hash of
    -- every order (which a plan made while the table looked small would keep).
    WHERE order_locked.n IS NOT NULL
       OR NOT EXISTS (SELECT FROM public.orders AS orders WHERE orders.payment_id = fresh.payment_id
                      OFFSET 0)
), claim AS (
    -- The ids claimed by inserting them, in id order; a conflict is a
    -- delivery that raced the first (record_event.sql).
    INSERT INTO public.processed_events AS pe
        (event_id, event_type, status, order_id, result, payload, trace_context)
    SELECT fresh.event_id, fresh.event_type, decision.step ->> 'outcome', decision.order_id,
           jsonb_strip_nulls(jsonb_build_object(
               'event_id', fresh.event_id,
               'status', decision.step ->> 'outcome',
               'order_id', decision.order_id)),
           fresh.body, fresh.trace_context
    FROM fresh JOIN decision ON decision.n = fresh.n
    ORDER BY fresh.event_id
    ON CONFLICT (event_id) DO UPDATE
        SET deliveries = pe.deliveries + 1, last_delivered_at = now()
    RETURNING pe.event_id, (pe.xmax = 0) AS claimed, pe.result::text AS body, pe.status
), claimed AS (
    SELECT fresh.n, fresh.event_id, fresh.trace_context, decision.order_id, decision.step,
           claim.claimed, claim.body, claim.status
    FROM claim
    JOIN fresh ON fresh.event_id = claim.event_id
    JOIN decision ON decision.n = fresh.n
), order_update AS (
    -- Only a claimed event changes anything.
    UPDATE public.orders AS orders SET status = claimed.step ->> 'set_status', updated_at = now()
    FROM claimed
    WHERE claimed.claimed AND orders.id = claimed.order_id
      AND claimed.step ->> 'set_status' IS NOT NULL
), commands AS (
    SELECT claimed.n, command.position,
           command.spec ->> 'kind' AS kind,
           jsonb_build_object('v', $7::int4,
                              'order_id', claimed.order_id,
                              'event_id', claimed.event_id) AS payload,
           (command.spec ->> 'key_prefix') || '-' || claimed.order_id AS idempotency_key,
           claimed.event_id, claimed.order_id, claimed.trace_context
    FROM claimed,
         jsonb_array_elements(claimed.step -> 'enqueue') WITH ORDINALITY AS command(spec, position)
    WHERE claimed.claimed AND claimed.order_id IS NOT NULL
), enqueued AS (
    INSERT INTO public.outbox (kind, payload, idempotency_key, event_id, order_id, trace_context)
    SELECT kind, payload, idempotency_key, event_id, order_id, trace_context
    FROM commands
    ORDER BY n, position
    -- One effect per order and kind, whatever the number of events.
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING idempotency_key
)
SELECT claimed.n, claimed.claimed, claimed.body, claimed.status,
       (SELECT count(*) FROM enqueued JOIN commands USING (idempotency_key)
        WHERE commands.n = claimed.n)::int4 AS enqueued
FROM claimed
UNION ALL
SELECT replayed.n, false, replayed.body, replayed.status, 0
FROM replayed
