-- The status of the orders the downstream sent a refund notice for.
SELECT id, status
FROM public.orders
WHERE id = ANY($1::bigint[])
