#!/usr/bin/env bash
# Runs a command with DATABASE_URL set: the caller's, or the throwaway
# cluster's (started, and created the first time, by scripts/pg-cluster.sh).
set -euo pipefail
if [ -z "${DATABASE_URL:-}" ]; then
  DATABASE_URL=$("$(dirname "$0")/pg-cluster.sh" start)
  export DATABASE_URL
fi
exec "$@"
