-- (kind, order) pairs with more than one outbox row created in the last $1
-- seconds: zero by construction (the idempotency key is unique), counted so
-- that a report can say so.
SELECT count(*) AS doubled
  FROM (SELECT 1
          FROM public.outbox
         WHERE created_at >= now() - $1 * interval '1 second'
         GROUP BY kind, order_id
        HAVING count(*) > 1) AS pairs
