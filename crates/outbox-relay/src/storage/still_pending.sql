-- Whether a claimed row is still pending under this claim (1) or not (0): a
-- refund may have cancelled a shipment while it waited for a call slot.
-- $1 outbox id, $2 lease owner, $3 the claim's number (`claims`).
SELECT count(*) AS held
  FROM public.outbox
 WHERE id = $1 AND lease_owner = $2 AND claims = $3 AND status = 'pending'
