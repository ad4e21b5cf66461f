# The commands a newcomer needs: `make run`, `make test`. CI (.ci/run) runs `make lint`, then `make test`,
# with the toolchain rust-toolchain.toml pins.
# Without DATABASE_URL, every target that needs Postgres starts (and the first
# time creates) a throwaway local cluster: see scripts/pg-cluster.sh.

SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all build release test lint fmt run bench soak deploy-check db-start db-stop db-url

all: build

build:
	$(CARGO) build --workspace --bins

release:
	$(CARGO) build --release --workspace --bins

## Every test, against a real Postgres (DATABASE_URL, or the throwaway cluster),
## then the offline check of the Kubernetes manifests against the binaries.
test: build
	scripts/with-db.sh scripts/test.sh
	scripts/deploy-check.sh

## Kubernetes manifests: schemas (offline) and their agreement with the binaries.
deploy-check: build
	scripts/deploy-check.sh

## fmt, clippy (the lints of Cargo.toml's [workspace.lints]; warnings are
## errors), then unused dependencies and unreachable files (cargo-shear,
## installed on first use: see scripts/lint-deps.sh). What CI runs first.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	scripts/lint-deps.sh

fmt:
	$(CARGO) fmt --all

## The incident replayed end to end: Postgres (throwaway unless DATABASE_URL),
## ingest, relay, simulated provider and downstream APIs, then the audit.
## RUN_EVENTS, RUN_DUPLICATE_RATE, RUN_CARRIER_LATENCY_MS: see scripts/run.sh.
run: release
	scripts/run.sh

## The chaos test and the per-order history checker at scale, for people
## (not CI): 200,000 events over about ten minutes through kills and
## restarts, then 20,000 orders' histories through relay and ingest kills and
## a Postgres restart; prints the tallies and the checker's report
## (target/chaos/tally.txt, target/history/report.txt).
soak: release
	cargo build --release -p e2e --tests
	CHAOS_EVENTS=$${CHAOS_EVENTS:-200000} CHAOS_RATE=$${CHAOS_RATE:-350} scripts/with-db.sh \
	  cargo test --release -p e2e --test e2e chaos -- --nocapture
	HISTORY_ORDERS=$${HISTORY_ORDERS:-20000} HISTORY_CHAOS=1 scripts/with-db.sh \
	  cargo test --release -p e2e --test e2e history -- --nocapture

db-start:
	@scripts/pg-cluster.sh start

db-url:
	@scripts/pg-cluster.sh url

## Stop the throwaway cluster (its data stays under /tmp for the next run).
db-stop:
	@scripts/pg-cluster.sh stop

## The benchmark (docs/BENCHMARK.md): a table, target/bench/report.json and report.md.
## BENCH_QUICK=1 for a short run (under 2 minutes); see scripts/bench/__init__.py.
bench: release
	scripts/with-db.sh env PYTHONPATH=scripts python3 -m bench
