-- Wakes the relays listening on channel $1: a NOTIFY in a transaction of its
-- own, committed without waiting for the WAL flush (a lost notification costs
-- a poll interval, nothing else: the rows it announces are durable already).
SELECT set_config('synchronous_commit', 'off', true) AS synchronous_commit,
       pg_notify($1, '') AS notified
