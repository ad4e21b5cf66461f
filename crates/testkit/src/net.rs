//! Reaching things over the network from a test: a port to give a server,
//! and an HTTP client to call it with.

/// A port free right now on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding an ephemeral port")
}

/// An HTTP client for tests (rustls with the ring provider installed once).
pub fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}
