-- An experiment, not a reference: reference-ingest-one-statement.sql for 8 events
-- per statement (docs/BENCHMARK.md, 'Several deliveries per statement'). Run
-- as the references are, on bench_ref: pgbench -n -M prepared -c 8 -T 6
-- -D run=$(date +%s%N) -D n=0 -f bench/experiments/reference-ingest-batch8.sql
\set n :n + 1
\set p1 random(1, 1000000)
\set p2 random(1, 1000000)
\set p3 random(1, 1000000)
\set p4 random(1, 1000000)
\set p5 random(1, 1000000)
\set p6 random(1, 1000000)
\set p7 random(1, 1000000)
\set p8 random(1, 1000000)
WITH input AS (
  SELECT * FROM unnest(ARRAY['evt_' || :run || '_' || :client_id || '_' || :n || '_1', 'evt_' || :run || '_' || :client_id || '_' || :n || '_2', 'evt_' || :run || '_' || :client_id || '_' || :n || '_3', 'evt_' || :run || '_' || :client_id || '_' || :n || '_4', 'evt_' || :run || '_' || :client_id || '_' || :n || '_5', 'evt_' || :run || '_' || :client_id || '_' || :n || '_6', 'evt_' || :run || '_' || :client_id || '_' || :n || '_7', 'evt_' || :run || '_' || :client_id || '_' || :n || '_8'], ARRAY['pay_' || :p1, 'pay_' || :p2, 'pay_' || :p3, 'pay_' || :p4, 'pay_' || :p5, 'pay_' || :p6, 'pay_' || :p7, 'pay_' || :p8]) AS t(event_id, payment_id)
), ev AS (
  INSERT INTO processed_events(event_id, event_type, result)
  SELECT event_id, 'payment_intent.succeeded', '{"ok": true, "outbox_rows": 2}'::jsonb FROM input
  RETURNING event_id
), o AS (
  UPDATE orders SET status = 'paid', paid_at = now()
  FROM input WHERE orders.payment_id = input.payment_id
  RETURNING orders.id, orders.payment_id, input.event_id
), ob AS (
  INSERT INTO outbox(event_id, kind, payload, idempotency_key, traceparent)
  SELECT o.event_id, k.kind,
         jsonb_build_object('order_id', o.id, 'payment_id', o.payment_id, 'action', k.action),
         k.kind || '-' || o.id || '-' || o.event_id,
         '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
  FROM o, (VALUES ('ship', 'ship'), ('conf', 'confirm_email')) AS k(kind, action)
  RETURNING id
)
SELECT (SELECT count(*) FROM ob) AS outbox_rows;
