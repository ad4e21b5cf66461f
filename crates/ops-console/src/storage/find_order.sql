-- The order a search names: $1 its id, or $2 its payment id (either may be
-- NULL). Two primary/unique index probes; at most two rows.
SELECT id, payment_id, status, created_at, updated_at FROM public.orders WHERE id = $1
UNION
SELECT id, payment_id, status, created_at, updated_at FROM public.orders WHERE payment_id = $2
