//! A proxy in front of a downstream or of a raw TCP server, and clients for both.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use simulator::downstream::{self, DownstreamConfig, RunningDownstream};
use simulator::proxy::{self, Faults, ProxyConfig, RunningProxy};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// A downstream, and a proxy in front of it.
pub struct Env {
    pub downstream: RunningDownstream,
    pub proxy: RunningProxy,
}

pub async fn env(faults: Faults) -> Env {
    let downstream = downstream::spawn(DownstreamConfig::default())
        .await
        .expect("starting the downstream");
    let proxy = spawn_proxy(downstream.addr(), faults).await;
    Env { downstream, proxy }
}

pub async fn spawn_proxy(upstream: SocketAddr, faults: Faults) -> RunningProxy {
    proxy::spawn(ProxyConfig {
        faults,
        ..ProxyConfig::new(upstream)
    })
    .await
    .expect("starting the proxy")
}

/// A client with keep-alive (one pooled connection is reused) and `timeout`.
pub fn client(timeout: Duration) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().timeout(timeout).build().unwrap()
}

pub fn shipment(order_id: i64) -> String {
    format!(r#"{{"order_id":{order_id},"event_id":"evt_{order_id}"}}"#)
}

/// `POST {base}/shipments` with key `ship-{order_id}`: the status, or the error.
pub async fn ship(http: &reqwest::Client, base: &str, order_id: i64) -> reqwest::Result<u16> {
    let response = http
        .post(format!("{base}/shipments"))
        .header("idempotency-key", format!("ship-{order_id}"))
        .header("content-type", "application/json")
        .body(shipment(order_id))
        .send()
        .await?;
    let status = response.status().as_u16();
    response.bytes().await?;
    Ok(status)
}

/// A raw TCP server: reads each connection to its end, records what it got,
/// then answers `answer(received)` and closes.
pub struct RawServer {
    pub addr: SocketAddr,
    /// What each connection sent, in the order they ended.
    pub received: Arc<Mutex<Vec<Vec<u8>>>>,
}

pub async fn raw_server(answer: fn(&[u8]) -> Vec<u8>) -> RawServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(Mutex::new(Vec::new()));
    let log = received.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                if socket.read_to_end(&mut got).await.is_err() {
                    return;
                }
                log.lock().unwrap().push(got.clone());
                let _ = socket.write_all(&answer(&got)).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    RawServer { addr, received }
}

/// Sends `request`, half-closes, and reads until the end: the bytes read,
/// and the error that ended the read, if any.
pub async fn exchange(addr: SocketAddr, request: &[u8]) -> (Vec<u8>, Option<std::io::Error>) {
    let mut socket = TcpStream::connect(addr).await.unwrap();
    // A fault may have reset the connection already; the read tells.
    let _ = socket.write_all(request).await;
    let _ = socket.shutdown().await;
    let mut got = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match socket.read(&mut chunk).await {
            Ok(0) => return (got, None),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) => return (got, Some(e)),
        }
    }
}

/// Polls `check` every 10 ms until it holds, or panics after `timeout`.
pub async fn eventually(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !check() {
        assert!(started.elapsed() < timeout, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
