#!/usr/bin/env bash
# `make run`: migrate, seed orders, and serve the ingest on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${DATABASE_URL:?DATABASE_URL must be set (use: make run)}"
bin=target/release
export WEBHOOK_SECRETS=${WEBHOOK_SECRETS:-whsec_ZGV2LW9ubHktc2VjcmV0LWNoYW5nZS1tZQ==}
export INGEST_LISTEN_ADDR=${INGEST_LISTEN_ADDR:-127.0.0.1:8080}
export ADMIN_LISTEN_ADDR=${ADMIN_LISTEN_ADDR:-127.0.0.1:9090}
export LOG_FORMAT=${LOG_FORMAT:-pretty}

"$bin/webhook-ingest" migrate
psql "$DATABASE_URL" -qc "INSERT INTO orders (id, payment_id) SELECT n, 'pay_' || n FROM generate_series(1, 1000) n ON CONFLICT DO NOTHING"
echo "orders pay_1 .. pay_1000 seeded; serving on http://$INGEST_LISTEN_ADDR/webhooks/payments (Ctrl-C stops)"
exec "$bin/webhook-ingest"
