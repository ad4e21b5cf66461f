-- A step of the claim-and-apply statements (an `-- include:` of
-- record_event.sql and replay_event.sql, expanded by build.rs): a claimed
-- event's new order status, when its plan step sets one.
), order_update AS (
    -- Only a claimed event changes anything.
    UPDATE public.orders AS orders SET status = decision.step ->> 'set_status', updated_at = now()
    FROM decision, claim
    WHERE claim.claimed AND orders.id = decision.order_id
      AND decision.step ->> 'set_status' IS NOT NULL
