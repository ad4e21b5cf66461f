//! The simulated provider over real HTTP on loopback, against a fake ingest
//! that verifies signatures and deduplicates as the real one does: in
//! process through the library, and the binary as scripts run it.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers beside the tests: a panic is how a test fails"
)]

mod binary;
mod delivery;
mod fake;
mod helpers;
mod load;
mod throughput;
