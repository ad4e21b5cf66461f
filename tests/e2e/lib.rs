//! End-to-end tests live in `e2e/main.rs` (one test binary); this library is empty.
