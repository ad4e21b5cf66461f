//! End-to-end tests: the real binaries as processes.

mod chaos;
mod harness;
mod observability;
mod pooler;
mod roles;
mod run_demo;
mod tls;
mod wake;
