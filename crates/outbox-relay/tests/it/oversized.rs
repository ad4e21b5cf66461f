//! A downstream that answers 500 with an endless body: the relay keeps a
//! bounded excerpt in `last_error`, stops reading, and moves on (the call
//! finishes well before the HTTP timeout; the body is never read to its end).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use crate::helpers::env;

/// Answers every request with a 500 whose chunked body never ends; counts
/// the bytes of body it managed to write.
async fn endless_error_downstream() -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                // The request head is enough: the answer does not depend on it.
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    let mut chunk = [0u8; 4096];
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let start = b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n";
                if socket.write_all(start).await.is_err() {
                    return;
                }
                let data = "oops ".repeat(13_107); // 65,535 bytes
                let chunk = format!("{:x}\r\n{data}\r\n", data.len());
                loop {
                    if socket.write_all(chunk.as_bytes()).await.is_err() {
                        return;
                    }
                    counter.fetch_add(data.len() as u64, Ordering::Relaxed);
                }
            });
        }
    });
    (url, sent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_error_body_is_cut_and_the_row_moves_on() {
    let env = env().await;
    let (url, sent) = endless_error_downstream().await;
    let id = env.enqueue("ship_order", 1, "evt_1").await;
    // The timeout is far longer than the wait: only a relay that stops
    // reading finishes the call in time.
    let relay = env.spawn_relay(&[
        ("FULFILMENT_URL", url.as_str()),
        ("RELAY_MAX_ATTEMPTS", "1"),
        ("RELAY_POLL_INTERVAL_MS", "50"),
        ("RELAY_HTTP_TIMEOUT_MS", "120000"),
        ("RELAY_LEASE_SECS", "300"),
        ("RELAY_PRUNE_INTERVAL_SECS", "0"),
    ]);
    env.wait_for(
        "SELECT count(*) FROM outbox WHERE status = 'dead'",
        1,
        Duration::from_secs(30),
    )
    .await;
    relay.signal("TERM");
    let (code, stderr) = relay.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{stderr}");
    let (status, attempts, last_error) = env.row_status(id).await;
    assert_eq!((status.as_str(), attempts), ("dead", 1));
    let last_error = last_error.unwrap();
    assert!(last_error.contains("HTTP 500: oops oops"), "{last_error}");
    assert!(last_error.len() <= 300, "{} bytes", last_error.len());
    let sent = sent.load(Ordering::Relaxed);
    assert!(sent < 64 << 20, "the relay read {sent} bytes of an error body");
}
