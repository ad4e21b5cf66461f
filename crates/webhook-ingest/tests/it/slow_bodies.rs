//! Clients that trickle their bodies, before any authentication, must not
//! take the in-flight permits real webhooks need: bodies are read under a
//! bound of their own, and a permit is held only by a verified delivery.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use crate::helpers::{event, spawn_app_with};

/// Opens a connection that sends a request's headers and the first bytes of
/// a 2,000-byte body, then a byte every 100 ms until the server answers.
/// Returns the status line it was answered with.
fn trickle(port: u16) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
        conn.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        conn.write_all(
            b"POST /webhooks/payments HTTP/1.1\r\nHost: localhost\r\n\
              Content-Type: application/json\r\nContent-Length: 2000\r\n\r\n{\"id\":",
        )
        .unwrap();
        let mut answer = Vec::new();
        for _ in 0..300 {
            let mut buf = [0u8; 512];
            match conn.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    if answer.windows(2).any(|w| w == b"\r\n") {
                        break;
                    }
                }
                Err(_) => {
                    // Nothing to read yet: one more byte of the body.
                    if conn.write_all(b" ").is_err() {
                        break;
                    }
                }
            }
        }
        String::from_utf8_lossy(&answer)
            .lines()
            .next()
            .unwrap_or("")
            .to_owned()
    })
}

/// Twelve trickling clients, three times the four permits. Before: they
/// held every permit while their bodies dripped in, and each real webhook
/// was shed with a 503. After: the real webhooks are processed, and each
/// trickling client is answered 503 once its body's bound (half the
/// deadline) passes, having written nothing.
#[tokio::test]
async fn trickling_bodies_take_no_permit_from_real_webhooks() {
    let app = spawn_app_with(&["--ingest-max-in-flight", "4", "--ingest-deadline-ms", "4000"]).await;
    for id in 1..=10 {
        app.insert_order(id, &format!("pay_{id}"), "pending").await;
    }
    let port: u16 = app.url.rsplit(':').next().unwrap().parse().unwrap();
    let tricklers: Vec<_> = (0..12).map(|_| trickle(port)).collect();
    // Their headers are in: every one of them is in the handler, reading.
    tokio::time::sleep(Duration::from_millis(500)).await;

    for id in 1..=10 {
        let response = app
            .post(&event(
                &format!("evt_real_{id}"),
                "payment.succeeded",
                &format!("pay_{id}"),
            ))
            .await;
        assert_eq!(
            response.status(),
            200,
            "webhook {id}: a real webhook is processed while slow bodies trickle in"
        );
    }
    assert!(
        tricklers.iter().all(|t| !t.is_finished()),
        "the trickling clients are still being read"
    );
    for t in tricklers {
        let status_line = tokio::task::spawn_blocking(move || t.join().unwrap())
            .await
            .unwrap();
        assert!(
            status_line.starts_with("HTTP/1.1 503"),
            "a body that does not arrive within its bound is answered 503: {status_line:?}"
        );
    }
    assert_eq!(
        app.count("SELECT count(*) FROM processed_events").await,
        10,
        "only the real webhooks were recorded"
    );
}

/// One unsigned request on `conn`, answered 401 and kept alive; the status
/// line, or `None` when nothing came within `wait`.
fn ask(conn: &mut TcpStream, wait: Duration) -> Option<String> {
    conn.set_read_timeout(Some(wait)).unwrap();
    conn.write_all(
        b"POST /webhooks/payments HTTP/1.1\r\nHost: localhost\r\n\
          Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    )
    .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    text.lines().next().map(str::to_owned)
}

/// The connections the ingest holds are bounded (as many as the bodies it
/// reads at once, four with one permit): one more waits in the listen backlog,
/// unanswered, and is served as soon as one of the others closes. Without
/// the bound, every connection a flooding provider opens is held, with its
/// buffers.
#[tokio::test]
async fn connections_beyond_the_bound_wait_until_one_closes() {
    let app = spawn_app_with(&["--ingest-max-in-flight", "1"]).await;
    let port: u16 = app.url.rsplit(':').next().unwrap().parse().unwrap();
    let workers = process::runtime::worker_threads();
    let bound = workers * (4_usize).div_ceil(workers);
    tokio::task::spawn_blocking(move || {
        let mut held: Vec<TcpStream> = (0..bound)
            .map(|_| {
                let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
                let status = ask(&mut conn, Duration::from_secs(10));
                assert_eq!(status.as_deref(), Some("HTTP/1.1 401 Unauthorized"));
                conn
            })
            .collect();
        let mut extra = TcpStream::connect(("127.0.0.1", port)).unwrap();
        assert_eq!(
            ask(&mut extra, Duration::from_secs(1)),
            None,
            "served beyond the bound"
        );
        drop(held.pop());
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        extra.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        while !answer.windows(2).any(|w| w == b"\r\n") {
            match extra.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
        assert!(
            answer.starts_with(b"HTTP/1.1 401"),
            "not served once a connection closed: {:?}",
            String::from_utf8_lossy(&answer)
        );
    })
    .await
    .unwrap();
}
