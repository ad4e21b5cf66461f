SELECT count(*) FROM public.outbox WHERE status = 'pending' AND available_at <= now() AND (leased_until IS NULL OR leased_until <= now())
