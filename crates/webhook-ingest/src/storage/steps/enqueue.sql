-- A step of the claim-and-apply statements (an `-- include:` of
-- record_event.sql and replay_event.sql, expanded by build.rs): a claimed
-- event's commands, in its plan step's order, once per order and kind.
), enqueued AS (
    INSERT INTO public.outbox (kind, payload, idempotency_key, event_id, order_id, trace_context)
    SELECT command.spec ->> 'kind',
           jsonb_build_object('v', params.payload_version,
                              'order_id', decision.order_id,
                              'event_id', params.event_id),
           (command.spec ->> 'key_prefix') || '-' || decision.order_id,
           params.event_id, decision.order_id, params.trace_context
    FROM params, decision, claim,
         jsonb_array_elements(decision.step -> 'enqueue') WITH ORDINALITY AS command(spec, position)
    WHERE claim.claimed AND decision.order_id IS NOT NULL
    ORDER BY command.position
    -- One effect per order and kind, whatever the number of events.
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING 1
