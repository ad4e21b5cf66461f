//! End-to-end tests: the real binaries as processes.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers beside the tests: a panic is how a test fails"
)]

mod architecture;
mod chaos;
mod console;
mod dev_cluster;
mod failover;
mod first_run;
mod ha_cluster;
mod harness;
mod history;
mod layout;
mod observability;
mod per_order;
mod pooler;
mod progress;
mod prometheus;
mod readme;
mod roles;
mod run_demo;
mod search_path;
mod send_webhook;
mod statements;
mod tls;
mod wake;
