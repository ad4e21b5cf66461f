-- A step of the claim-and-apply statements (an `-- include:` of
-- record_event.sql for refunds and of replay_event.sql, expanded by
-- build.rs): the order's shipment stopped, when the plan step says which
-- (`stop_shipment`: its kind and key prefix).
), stopped AS (
    -- The order's shipment, stopped. An upsert on its unique key, not an
    -- UPDATE of a row found by a look-up: this statement's snapshot was taken
    -- before it waited for the order's lock, so a look-up misses the shipment
    -- that a payment holding the lock just committed. ON CONFLICT finds and
    -- locks the latest committed row whatever the snapshot. A row not yet
    -- sent (or dead) is cancelled; a row whose call is under way keeps its
    -- lease, so its holder may still record `done` for THAT call and nothing
    -- else (the relay's completion is fenced on its claim); a done row stays
    -- done. With no row at all (retention removed it long after it was
    -- done), the proposed row is written, cancelled, saying why.
    INSERT INTO public.outbox AS o (kind, payload, idempotency_key, event_id, order_id, trace_context,
                             status, finished_at, last_error)
    SELECT decision.step -> 'stop_shipment' ->> 'kind',
           jsonb_build_object('v', params.payload_version,
                              'order_id', decision.order_id,
                              'event_id', params.event_id),
           (decision.step -> 'stop_shipment' ->> 'key_prefix') || '-' || decision.order_id,
           params.event_id, decision.order_id, params.trace_context,
           'cancelled', now(), 'no shipment to stop: retention had removed it; refund ' || params.event_id
    FROM params, decision, claim
    WHERE claim.claimed AND decision.step ? 'stop_shipment'
    ON CONFLICT (idempotency_key) DO UPDATE
        -- $1 is params.event_id: this clause sees only the row and EXCLUDED,
        -- and the ingest may not read EXCLUDED.event_id (outbox.event_id).
        SET status = 'cancelled', finished_at = now(), last_error = 'cancelled by ' || $1
        WHERE o.status IN ('pending', 'dead')
