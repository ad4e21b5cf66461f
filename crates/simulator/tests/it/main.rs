//! The simulated downstream over real HTTP on loopback: in process through
//! the library, and the binary as scripts run it.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers beside the tests: a panic is how a test fails"
)]

mod audit;
mod binary;
mod calls;
mod control;
mod faults;
mod helpers;
mod idempotency;
