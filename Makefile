# The commands a newcomer needs: `make run`, `make test`; `make help` lists
# every target. CI (.ci/run) runs `make lint`, then `make test`, with the
# toolchain rust-toolchain.toml pins.
# Each target's `## ` comment is its documentation; its first line is what
# `make help` prints, so it says what the target does on its own.
# Without DATABASE_URL, every target that needs Postgres starts (and the first
# time creates) a throwaway local cluster: see scripts/pg-cluster.sh.

SHELL := /bin/bash
CARGO ?= cargo
# Which cargo build `make images` and `make deploy-smoke` package: release,
# or debug (what `make test` has built already).
IMAGES_PROFILE ?= release
images_build = $(if $(filter debug,$(IMAGES_PROFILE)),build,release)

.PHONY: all help build release test failover lint fmt run bench soak deploy-check images deploy-smoke db-start db-stop db-url

## The default: the debug binaries (same as `make build`).
all: build

## Every target with the first line of its comment.
help:
	@printf 'make <target> (default: build)\n\n'
	@awk '/^## / { if (doc == "") doc = substr($$0, 4); next } \
	  /^[a-z][a-z0-9-]*:/ { t = $$0; sub(/:.*/, "", t); printf "  %-13s %s\n", t, doc } \
	  { doc = "" }' $(firstword $(MAKEFILE_LIST))

## The debug binaries of every crate (target/debug).
build:
	$(CARGO) build --workspace --bins

## The release binaries (target/release), which run, bench and soak measure.
release:
	$(CARGO) build --release --workspace --bins

## Every test against a real Postgres, then the Kubernetes manifests' check and smoke.
## Postgres: DATABASE_URL, or the throwaway cluster; the manifests are
## checked offline against the binaries, then the debug binaries' images
## played with the dev overlay by podman kube play (make deploy-smoke; skipped, saying so, where podman
## cannot be installed, unless CI is set).
test: build
	scripts/with-db.sh scripts/test.sh
	scripts/deploy-check.sh
	IMAGES_PROFILE=debug CONTAINERS_OPTIONAL=1 scripts/deploy-smoke.sh

## An acknowledged payment survives the loss of the primary, on Patroni.
## A real HA Postgres (scripts/ha-cluster.sh: etcd and two Patroni nodes on
## loopback, installed from Debian's packages on first use) under the history
## checker's workload; the primary's postmaster SIGKILLed a third of the way,
## a standby promoted, nothing restarted by hand. Synchronous replication:
## no acknowledged event lost, no double effect, every per-order rule; then
## asynchronous: the acknowledged events it lost (FAILOVER_ASYNC_RUNS runs).
## Prints the window with no 200 and the relays' first claim after the kill.
## Then ha_cluster: raw writes through the same kill, none lost. About two
## and a half minutes; CI runs it after `make test` (tests/e2e/failover.rs).
failover: build
	cargo test -p e2e --test e2e -- --ignored --nocapture --test-threads 1 failover ha_cluster

## The Kubernetes manifests: schemas (offline) and their agreement with the binaries.
deploy-check: build
	scripts/deploy-check.sh

## The three images (deploy/Dockerfile: ingest, relay, console) with podman, from the host's release binaries.
## No registry and no crates.io inside the build: the binaries cargo built
## here and a local stand-in for the distroless base (scripts/images.sh);
## podman is installed the first time. IMAGES_PROFILE=debug: target/debug.
images: $(images_build)
	IMAGES_PROFILE=$(IMAGES_PROFILE) scripts/images.sh

## The rendered dev overlay played by `podman kube play`, with a named shim for
## what podman 4.3 cannot do. Builds the images (make images), then the
## migration Job, the ingest and the relay: webhooks, probes, the
## database stopped and started, SIGTERM with work in flight, and three broken
## renders it must refuse (scripts/deploy_smoke). About a minute.
deploy-smoke: $(images_build)
	IMAGES_PROFILE=$(IMAGES_PROFILE) scripts/deploy-smoke.sh

## What CI runs first: fmt, clippy with warnings as errors, unused dependencies.
## Clippy with the lints of Cargo.toml's [workspace.lints]; then unused
## dependencies and unreachable files (cargo-shear, installed on first use:
## see scripts/lint-deps.sh).
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	scripts/lint-deps.sh

## Format every crate (rustfmt).
fmt:
	$(CARGO) fmt --all

## The incident replayed end to end, then the audit of its effects.
## Postgres (throwaway unless DATABASE_URL), ingest, relay, simulated provider
## and downstream APIs.
## RUN_EVENTS, RUN_DUPLICATE_RATE, RUN_CARRIER_LATENCY_MS: see scripts/run.sh.
run: release
	scripts/run.sh

## The chaos test and the per-order history checker at scale, for people (not CI).
## 200,000 events over about ten minutes through kills and restarts, then
## 20,000 orders' histories through relay and ingest kills and a Postgres
## restart. Both print a progress line every 5 s (events sent, acknowledged,
## effects, rate, phase), then the tallies and the checker's report
## (target/chaos/tally.txt, target/history/report.txt).
soak: release
	cargo build --release -p e2e --tests
	CHAOS_EVENTS=$${CHAOS_EVENTS:-200000} CHAOS_RATE=$${CHAOS_RATE:-350} scripts/with-db.sh \
	  cargo test --release -p e2e --test e2e chaos -- --nocapture
	HISTORY_ORDERS=$${HISTORY_ORDERS:-20000} HISTORY_CHAOS=1 scripts/with-db.sh \
	  cargo test --release -p e2e --test e2e history -- --nocapture

## Start the throwaway Postgres cluster (created on first use).
db-start:
	@scripts/pg-cluster.sh start

## Print the throwaway cluster's admin URL (password included).
db-url:
	@scripts/pg-cluster.sh url

## Stop the throwaway cluster (its data stays under /tmp for the next run).
db-stop:
	@scripts/pg-cluster.sh stop

## The benchmark (docs/BENCHMARK.md): report.{json,md} in target/bench.
## A full run also rewrites the latest figures in docs/BENCHMARK.md and the
## README; BENCH_QUICK=1 is a shorter run that writes target/bench only.
## The phases: PYTHONPATH=scripts python3 -m bench --list.
bench: release
	scripts/with-db.sh env PYTHONPATH=scripts python3 -m bench
