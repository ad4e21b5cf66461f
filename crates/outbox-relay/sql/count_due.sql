SELECT count(*) FROM outbox WHERE status = 'pending' AND available_at <= now()
