#!/usr/bin/env bash
# Runs a command with DATABASE_URL set: the caller's, or the throwaway
# cluster's (started, and created the first time, by scripts/pg-cluster.sh).
set -euo pipefail
[ -n "${DATABASE_URL:-}" ] || DATABASE_URL=$("$(dirname "$0")/pg-cluster.sh" start)
export DATABASE_URL
exec "$@"
