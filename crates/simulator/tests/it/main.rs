//! The simulated downstream over real HTTP on loopback: in process through
//! the library, and the binary as scripts run it.

mod audit;
mod binary;
mod calls;
mod control;
mod faults;
mod helpers;
mod idempotency;
