//! Hostile input: arbitrary headers, bodies and sizes never panic and never
//! write a row unless signed; any single-byte change is rejected; slow and
//! oversized requests are cut off by timeouts and limits.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::helpers::{SECRET, TestApp, event, now, spawn_app_with, standard_headers};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Header names a request may carry, the signature ones most of all.
fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("webhook-id".to_owned()),
        Just("webhook-timestamp".to_owned()),
        Just("webhook-signature".to_owned()),
        Just("stripe-signature".to_owned()),
        Just("content-type".to_owned()),
        Just("traceparent".to_owned()),
        "[a-z][a-z0-9-]{0,20}",
    ]
}

fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // Printable, the usual shape of a header value.
        "[ -~]{0,200}".prop_map(String::into_bytes),
        // Anything an HTTP header may legally carry (no CR, LF or NUL).
        proptest::collection::vec(
            any::<u8>().prop_filter("no CR/LF/NUL", |b| ![0u8, b'\r', b'\n'].contains(b)),
            0..100
        ),
        // Signature-looking noise.
        "v1,[A-Za-z0-9+/=]{0,60}( v1,[A-Za-z0-9+/=]{0,60}){0,3}".prop_map(String::into_bytes),
        "t=[0-9]{0,12},v1=[0-9a-f]{0,64}".prop_map(String::into_bytes),
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..2048),
        "[ -~]{0,500}".prop_map(String::into_bytes),
        ("[a-z0-9_]{1,40}", "[a-z.]{1,30}").prop_map(|(id, ty)| event(&id, &ty, "pay_1").into_bytes()),
        Just(vec![b'{'; 300_000]),
    ]
}

async fn send_raw(app: &TestApp, headers: &[(String, Vec<u8>)], body: Vec<u8>) -> u16 {
    let mut req = app.http.post(format!("{}/webhooks/payments", app.url)).body(body);
    for (k, v) in headers {
        let (Ok(name), Ok(value)) = (
            reqwest::header::HeaderName::from_bytes(k.as_bytes()),
            reqwest::header::HeaderValue::from_bytes(v),
        ) else {
            continue;
        };
        req = req.header(name, value);
    }
    req.send()
        .await
        .expect("the server answers whatever it is sent")
        .status()
        .as_u16()
}

/// Unsigned requests of every shape: 4xx, never a 5xx, never a row.
#[test]
fn arbitrary_unsigned_requests_never_panic_and_never_write() {
    let rt = runtime();
    let app = rt.block_on(spawn_app_with(&[]));
    rt.block_on(app.insert_order(1, "pay_1", "pending"));
    let mut runner = TestRunner::new(Config {
        cases: 200,
        ..Config::default()
    });
    runner
        .run(
            &(
                proptest::collection::vec((header_name(), header_value()), 0..8),
                body(),
            ),
            |(headers, body)| {
                let status = rt.block_on(send_raw(&app, &headers, body));
                prop_assert!(matches!(status, 400 | 401 | 413), "status {status}");
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(
        rt.block_on(app.written()),
        (0, 0),
        "no unsigned request wrote anything"
    );
    assert_eq!(rt.block_on(app.order_status(1)), "pending");
}

/// Signed bodies of every shape: never a 5xx; a row only for an event.
#[test]
fn arbitrary_signed_bodies_are_answered_without_a_server_error() {
    let rt = runtime();
    let app = rt.block_on(spawn_app_with(&[]));
    let mut runner = TestRunner::new(Config {
        cases: 150,
        ..Config::default()
    });
    let accepted = std::sync::atomic::AtomicI64::new(0);
    runner
        .run(&body(), |body| {
            let text = String::from_utf8_lossy(&body).into_owned();
            let status = rt.block_on(async {
                // Sign the exact bytes sent (lossy text only when it round-trips).
                let headers = standard_headers(SECRET, now(), &text);
                let raw: Vec<(String, Vec<u8>)> = headers
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v.into_bytes()))
                    .collect();
                send_raw(&app, &raw, text.clone().into_bytes()).await
            });
            prop_assert!(
                matches!(status, 200 | 400 | 413),
                "status {status} for {text:.80}"
            );
            if status == 200 {
                accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        })
        .unwrap();
    let rows = rt.block_on(app.count("SELECT count(*) FROM processed_events"));
    let accepted = accepted.into_inner();
    assert!(
        rows <= accepted,
        "a row only for an accepted event: {rows} rows, {accepted} accepted"
    );
}

/// Any single-byte change of a signed request's body, signature or
/// timestamp is a 401, and writes nothing.
#[test]
fn any_single_byte_change_is_rejected() {
    let rt = runtime();
    let app = rt.block_on(spawn_app_with(&[]));
    rt.block_on(app.insert_order(1, "pay_1", "pending"));
    let body = event("evt_tamper", "payment.succeeded", "pay_1");
    let headers = standard_headers(SECRET, now(), &body);
    let mut runner = TestRunner::new(Config {
        cases: 150,
        ..Config::default()
    });
    runner
        .run(
            &(0usize..3, any::<prop::sample::Index>(), 1u8..=255),
            |(part, at, delta)| {
                let mut raw: Vec<(String, Vec<u8>)> = headers
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), v.clone().into_bytes()))
                    .collect();
                let mut bytes = body.clone().into_bytes();
                let target: &mut Vec<u8> = match part {
                    0 => &mut bytes,
                    1 => &mut raw.iter_mut().find(|(k, _)| k == "webhook-signature").unwrap().1,
                    _ => &mut raw.iter_mut().find(|(k, _)| k == "webhook-timestamp").unwrap().1,
                };
                // The signature's `v1,` prefix is the scheme's, not signed content.
                let skip = if part == 1 { 3 } else { 0 };
                let i = skip + at.index(target.len() - skip);
                target[i] = target[i].wrapping_add(delta);
                let status = rt.block_on(send_raw(&app, &raw, bytes));
                // A changed body may stop being JSON or grow past nothing: still
                // nothing but a rejection before the database.
                prop_assert!(matches!(status, 400 | 401), "status {status}");
                prop_assert_eq!(rt.block_on(app.written()), (0, 0));
                Ok(())
            },
        )
        .unwrap();
    // Untouched, it goes through.
    let ok = rt.block_on(app.post_with(&body, &headers));
    assert_eq!(ok.status(), 200);
}

fn raw_connection(app: &TestApp) -> TcpStream {
    let addr = app.url.trim_start_matches("http://");
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream
}

/// Reads until the server closes or answers; returns what it sent and when.
fn read_until_closed(mut stream: TcpStream) -> (String, Duration) {
    let started = Instant::now();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    (String::from_utf8_lossy(&buf).into_owned(), started.elapsed())
}

/// Headers dribbled one byte at a time are cut off at the deadline.
#[tokio::test(flavor = "multi_thread")]
async fn a_slowloris_request_is_cut_off() {
    let app = spawn_app_with(&["--ingest-deadline-ms", "1000"]).await;
    let mut stream = raw_connection(&app);
    let started = Instant::now();
    let head = b"POST /webhooks/payments HTTP/1.1\r\nHost: x\r\nwebhook-id: m\r\nX-Slow: ";
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        std::thread::spawn(move || {
            for b in head
                .iter()
                .chain(b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".iter())
            {
                if stream.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let (answer, _) = tokio::task::spawn_blocking(move || {
        let _ = stream.flush();
        read_until_closed(stream)
    })
    .await
    .unwrap();
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(4), "cut off after {elapsed:?}");
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer:?}"
    );
    writer.join().unwrap();
    assert_eq!(app.written().await, (0, 0));
}

/// A body that never finishes arriving is a 503 at the deadline (nothing written).
#[tokio::test(flavor = "multi_thread")]
async fn a_body_that_never_arrives_is_cut_off_at_the_deadline() {
    let app = spawn_app_with(&["--ingest-deadline-ms", "1000"]).await;
    let mut stream = raw_connection(&app);
    let started = Instant::now();
    stream
        .write_all(b"POST /webhooks/payments HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"id\":")
        .unwrap();
    let (answer, _) = tokio::task::spawn_blocking(move || read_until_closed(stream))
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(4), "{elapsed:?}");
    assert!(
        answer.starts_with("HTTP/1.1 503") || answer.is_empty(),
        "{answer:?}"
    );
    assert_eq!(app.written().await, (0, 0));
}

/// A huge header is refused by the HTTP layer; the server keeps serving.
#[tokio::test(flavor = "multi_thread")]
async fn a_huge_header_is_refused_and_the_server_survives() {
    let app = spawn_app_with(&[]).await;
    let mut stream = raw_connection(&app);
    let huge = "a".repeat(200 * 1024);
    let request = format!(
        "POST /webhooks/payments HTTP/1.1\r\nHost: x\r\nX-Huge: {huge}\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    let _ = stream.write_all(request.as_bytes());
    let (answer, _) = tokio::task::spawn_blocking(move || read_until_closed(stream))
        .await
        .unwrap();
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431") || answer.starts_with("HTTP/1.1 400"),
        "{answer:.100}"
    );
    app.insert_order(1, "pay_1", "pending").await;
    let r = app
        .post(&event("evt_after_huge", "payment.succeeded", "pay_1"))
        .await;
    assert_eq!(r.status(), 200, "the server still serves");
}

/// A signed event Postgres' jsonb cannot hold (a `\u0000`, a lone surrogate,
/// a number beyond `numeric`, nesting thousands deep), in a field the parser
/// skips, is a 400 naming why, and writes nothing; the same things just
/// within what jsonb holds are recorded (200). Both sides of each bound,
/// against the real database: a bound set too loose would show a 500 here,
/// one set too tight a 400.
#[tokio::test]
async fn what_jsonb_cannot_hold_is_refused_and_what_it_can_is_recorded() {
    let app = spawn_app_with(&[]).await;
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let refused = [
        (r#""\u0000""#.to_owned(), "NUL"),
        (r#""\ud800""#.to_owned(), "surrogate"),
        (r#""\udc00\ud83d\ude00""#.to_owned(), "surrogate"),
        (r#""\ud83d\u0041""#.to_owned(), "surrogate"),
        ("1e131072".to_owned(), "number"),
        ("-0.5e131073".to_owned(), "number"),
        ("0e-16384".to_owned(), "number"),
        ("1e-16384".to_owned(), "number"),
        (format!("0.{}1", "0".repeat(16383)), "number"),
        ("0e2000000000".to_owned(), "number"),
        (deep(129), "deep"),
        (deep(20_000), "deep"),
    ];
    for (n, (value, why)) in refused.iter().enumerate() {
        let body = format!(r#"{{"id": "evt_bad_{n}", "type": "payment.succeeded", "z": {value}}}"#);
        let r = app.post(&body).await;
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert_eq!(status, 400, "{value:.60}: {text}");
        assert!(text.contains(why), "{value:.60}: {text}");
    }
    assert_eq!(app.count("SELECT count(*) FROM processed_events").await, 0);

    let held = [
        r#""\ud83d\ude00 \uD83D\uDE00""#.to_owned(),
        "1.5e131071".to_owned(),
        "-9e131071".to_owned(),
        "1e400".to_owned(),
        "0e-16383".to_owned(),
        "1e-16383".to_owned(),
        format!("0.{}1", "0".repeat(16382)),
        format!("1{}", "0".repeat(20_000)),
        "0e1073741822".to_owned(),
        deep(127),
    ];
    for (n, value) in held.iter().enumerate() {
        let body = format!(r#"{{"id": "evt_ok_{n}", "type": "payment.succeeded", "z": {value}}}"#);
        let r = app.post(&body).await;
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert_eq!(status, 200, "{value:.60}: {text}");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM processed_events WHERE payload ? 'z'")
            .await,
        held.len() as i64
    );
}
