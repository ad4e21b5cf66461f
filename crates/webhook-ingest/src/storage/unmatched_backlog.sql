-- What the unmatched gauges show: the first delivery of the oldest event
-- still `unmatched` (the first entry of the partial index), and how many
-- were first delivered before $1, the provider's retry horizon: those the
-- reconciler no longer applies, for an operator to replay or discard.
-- Bounded: at most $2 are counted, so a flood of them costs no more.
-- The oldest is read as the first entry of the index (ORDER BY ... LIMIT 1),
-- never as min(), which a plan made while the table was small computes by
-- reading every entry.
SELECT (SELECT processed_at FROM public.processed_events WHERE status = 'unmatched'
         ORDER BY processed_at LIMIT 1) AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM public.processed_events
             WHERE status = 'unmatched' AND processed_at < $1
             LIMIT $2) AS past)::int8 AS past_horizon
