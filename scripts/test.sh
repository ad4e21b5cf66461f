#!/usr/bin/env bash
# The scripts' own Python tests, then every test of the workspace against
# DATABASE_URL (an admin URL: tests create a database each). Uses
# cargo-nextest when installed (one process per test, so a test that kills
# processes or stops a cluster cannot disturb another), else cargo test.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${DATABASE_URL:?DATABASE_URL must be set (use: make test)}"

# Databases left by an interrupted earlier run.
psql_url=$DATABASE_URL
if command -v psql >/dev/null 2>&1; then
  psql "$psql_url" -qAt -c "SELECT datname FROM pg_database WHERE datname LIKE 't\_%'" 2>/dev/null \
    | while read -r name; do psql "$psql_url" -q -c "DROP DATABASE IF EXISTS \"$name\" WITH (FORCE)" >/dev/null 2>&1 || true; done
fi

# The scripts' own tests (the bench's documents, written from its report).
python3 -m unittest discover --start-directory scripts --top-level-directory scripts --pattern 'test_*.py'

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
else
  cargo test --workspace --no-fail-fast "$@"
fi
