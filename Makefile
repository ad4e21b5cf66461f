# The commands a newcomer needs: `make run`, `make test`. CI runs `make test`.
# Without DATABASE_URL, every target that needs Postgres starts (and the first
# time creates) a throwaway local cluster: see scripts/pg-cluster.sh.

SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all build release test test-unit lint fmt run bench db-start db-stop db-url clean-test-dbs

all: build

build:
	$(CARGO) build --workspace --bins

release:
	$(CARGO) build --release --workspace --bins

## Every test, against a real Postgres (DATABASE_URL, or the throwaway cluster).
test: build
	scripts/with-db.sh scripts/test.sh

## fmt + clippy, warnings are errors.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## Start Postgres (throwaway unless DATABASE_URL), migrate, and run the product.
run: release
	scripts/with-db.sh scripts/run.sh

db-start:
	@scripts/pg-cluster.sh start

db-url:
	@scripts/pg-cluster.sh url

## Stop the throwaway cluster (its data stays under /tmp for the next run).
db-stop:
	@scripts/pg-cluster.sh stop
