//! Reaching things over the network from a test: a port to give a server,
//! and an HTTP client to call it with.

use std::collections::BTreeSet;
use std::hash::{BuildHasher as _, Hasher as _};
use std::net::TcpListener;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The lowest port [`free_port`] gives: above the well-known and the usual
/// registered servers' ports.
const LOWEST: u16 = 10_000;

/// A port free right now on 127.0.0.1, for a server the test starts next.
/// Picked at random below the kernel's ephemeral range, never in it: the
/// outgoing connections of the tests running beside (each a process of its
/// own under nextest) take their local ports from that range, and a port of
/// it, free when picked and until the server binds it, was now and then
/// taken by one meanwhile (CI: `binding ADMIN_LISTEN_ADDR ...: Address
/// already in use`). Below the range only another test's pick can meet it,
/// one in some twenty thousand. Never a port it gave before in this process:
/// a test asking for two (a console's and its admin's) got the same one
/// twice in CI, and its server could not bind the second.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let highest = ephemeral_range_start().unwrap_or(32_768).saturating_sub(1);
    if highest > LOWEST {
        static PICKS: AtomicU64 = AtomicU64::new(0);
        let random = std::collections::hash_map::RandomState::new();
        for _ in 0..1_000 {
            let mut hasher = random.build_hasher();
            hasher.write_u64(PICKS.fetch_add(1, Ordering::Relaxed));
            hasher.write_u32(std::process::id());
            let port = LOWEST + (hasher.finish() % u64::from(highest - LOWEST + 1)) as u16;
            if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.insert(port);
                return port;
            }
        }
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding an ephemeral port");
    given.insert(port);
    port
}

/// The first port of the range the kernel gives outgoing connections (and
/// binds to port 0) on Linux; `None` elsewhere.
fn ephemeral_range_start() -> Option<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// An HTTP client for tests (rustls with the ring provider installed once).
pub fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_picked_below_the_ephemeral_range_and_never_twice() {
        let Some(start) = ephemeral_range_start() else {
            return; // not Linux: the kernel's pick
        };
        // At random, 2,000 picks of some 20,000 ports repeat about 90 times.
        let ports: BTreeSet<u16> = (0..2_000).map(|_| free_port()).collect();
        assert!(
            ports.iter().all(|&p| (LOWEST..start).contains(&p)),
            "{ports:?} not all in {LOWEST}..{start}"
        );
        assert_eq!(ports.len(), 2_000, "a port given twice");
    }
}
