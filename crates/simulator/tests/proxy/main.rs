//! The fault-injecting proxy over real TCP on loopback, between real clients
//! and servers (the simulated downstream, and raw TCP servers where bytes
//! matter): in process through the library, and the binary as scripts run it.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers beside the tests: a panic is how a test fails"
)]

mod binary;
mod control;
mod faults;
mod forward;
mod helpers;
