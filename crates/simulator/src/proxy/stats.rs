//! The snapshot behind `GET /stats` and [`super::RunningProxy::stats`], and
//! the counters it is read from. One type for both, `Deserialize` too, so a
//! test that runs the binary parses the JSON into the struct a test in
//! process gets directly.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

/// What the proxy saw and did since it started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Connections accepted.
    pub connections: u64,
    /// Connections open now (black-holed ones included).
    pub open: u64,
    /// Connections whose upstream could not be reached (reset at once).
    pub upstream_failures: u64,
    /// Bytes forwarded from clients to the upstream.
    pub bytes_to_upstream: u64,
    /// Bytes forwarded from the upstream to clients.
    pub bytes_to_client: u64,
    /// Faults applied.
    pub injected: Injected,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Injected {
    /// Chunks held back by `delay_ms`.
    pub delays: u64,
    /// Connections cut (reset on both sides) by `cut_after_bytes` or `cut_rate`.
    pub cuts: u64,
    /// Connections black-holed, at accept or while open.
    pub blackholes: u64,
    /// Times the listener was closed by `refuse`.
    pub refusals: u64,
    /// Connections reset because `refuse` was set: open ones, and any
    /// accepted just as the listener closed.
    pub refused_resets: u64,
}

/// The live counters; relaxed atomics, read one by one into a [`Stats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub connections: AtomicU64,
    pub open: AtomicU64,
    pub upstream_failures: AtomicU64,
    pub bytes_to_upstream: AtomicU64,
    pub bytes_to_client: AtomicU64,
    pub delays: AtomicU64,
    pub cuts: AtomicU64,
    pub blackholes: AtomicU64,
    pub refusals: AtomicU64,
    pub refused_resets: AtomicU64,
}

impl Counters {
    pub fn count(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// Counts a connection as accepted and open, until the guard is dropped.
    pub fn opened(&self) -> OpenGuard<'_> {
        self.connections.fetch_add(1, Relaxed);
        self.open.fetch_add(1, Relaxed);
        OpenGuard(&self.open)
    }

    pub fn snapshot(&self) -> Stats {
        let get = |counter: &AtomicU64| counter.load(Relaxed);
        Stats {
            connections: get(&self.connections),
            open: get(&self.open),
            upstream_failures: get(&self.upstream_failures),
            bytes_to_upstream: get(&self.bytes_to_upstream),
            bytes_to_client: get(&self.bytes_to_client),
            injected: Injected {
                delays: get(&self.delays),
                cuts: get(&self.cuts),
                blackholes: get(&self.blackholes),
                refusals: get(&self.refusals),
                refused_resets: get(&self.refused_resets),
            },
        }
    }
}

pub(crate) struct OpenGuard<'a>(&'a AtomicU64);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}
