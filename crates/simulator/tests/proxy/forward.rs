//! Without faults, the proxy is invisible: the same bytes both ways, half
//! closes included, and HTTP keep-alive works through it.

use std::time::Duration;

use simulator::proxy::Faults;

use crate::helpers::{client, env, exchange, raw_server, ship, spawn_proxy};

#[tokio::test]
async fn http_passes_through_with_keep_alive() {
    let env = env(Faults::default()).await;
    let http = client(Duration::from_secs(5));
    assert_eq!(ship(&http, &env.proxy.url(), 1).await.unwrap(), 201);
    assert_eq!(ship(&http, &env.proxy.url(), 1).await.unwrap(), 201, "a replay");
    assert_eq!(ship(&http, &env.proxy.url(), 2).await.unwrap(), 201);

    let downstream = env.downstream.stats();
    assert_eq!(
        (downstream.requests, downstream.effects, downstream.replays),
        (3, 2, 1)
    );
    let stats = env.proxy.stats();
    assert_eq!(stats.connections, 1, "one pooled connection for all three");
    assert_eq!(stats.open, 1);
    assert!(
        stats.bytes_to_upstream > 3 * 50 && stats.bytes_to_client > 3 * 50,
        "{stats:?}"
    );
    assert_eq!(stats.injected, Default::default());
    assert_eq!(stats.upstream_failures, 0);
}

#[tokio::test]
async fn a_mebibyte_each_way_arrives_whole_across_half_closes() {
    // The server answers only after the client's half-close: the proxy must
    // forward the FIN and keep the answer's direction open.
    let server = raw_server(|got| got.iter().rev().copied().collect()).await;
    let proxy = spawn_proxy(server.addr, Faults::default()).await;
    let request: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();

    let (answer, error) = exchange(proxy.addr(), &request).await;
    assert!(error.is_none(), "{error:?}");
    let expected: Vec<u8> = request.iter().rev().copied().collect();
    assert!(answer == expected, "the answer differs ({} bytes)", answer.len());
    assert_eq!(server.received.lock().unwrap()[0], request);
    let stats = proxy.stats();
    assert_eq!(
        (stats.bytes_to_upstream, stats.bytes_to_client),
        (1024 * 1024, 1024 * 1024)
    );
}

#[tokio::test]
async fn an_unreachable_upstream_resets_the_client() {
    // A port nobody listens on: bound, noted, released.
    let gone = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = spawn_proxy(gone, Faults::default()).await;
    let (answer, _) = exchange(proxy.addr(), b"hello").await;
    assert!(answer.is_empty());
    assert_eq!(proxy.stats().upstream_failures, 1);
}
