#!/usr/bin/env bash
# `make test`: the scripts' own Python tests, then every test of the workspace against
# DATABASE_URL (an admin URL: tests create a database each), with cargo-nextest when
# installed (a process per test: one that kills processes disturbs no other), else cargo test.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${DATABASE_URL:?DATABASE_URL must be set (use: make test)}"

# The databases an interrupted earlier run left.
psql "$DATABASE_URL" -q >/dev/null 2>&1 <<<"SELECT format('DROP DATABASE %I WITH (FORCE)', datname)
  FROM pg_database WHERE datname LIKE 't\_%' \gexec" || true

python3 -m unittest discover --start-directory scripts --top-level-directory scripts --pattern 'test_*.py'
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
else
  cargo test --workspace --no-fail-fast "$@"
fi
