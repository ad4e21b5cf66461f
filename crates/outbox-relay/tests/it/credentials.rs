//! Downstream credentials: `FULFILMENT_AUTHORIZATION` and
//! `EMAIL_AUTHORIZATION` reach their own endpoint as the `Authorization`
//! header (and nothing is sent when they are unset), and no credential, nor a
//! URL's user and password, shows in a row, a log line or an operator
//! command's output.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use crate::helpers::{Env, env};

/// What a request carried: its path and every `Authorization` header.
type Seen = Arc<Mutex<Vec<(String, Vec<String>)>>>;

/// A downstream that answers 200 to everything and records each request's
/// path and `Authorization` headers (the simulator records no headers).
async fn recording_downstream() -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen: Seen = Arc::default();
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let record = record.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // One request: the head, then Content-Length bytes of body.
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
                    let mut lines = head.split("\r\n");
                    let path = lines
                        .next()
                        .and_then(|l| l.split(' ').nth(1))
                        .unwrap_or_default()
                        .to_owned();
                    let mut length = 0usize;
                    let mut authorization = Vec::new();
                    for line in lines {
                        let Some((name, value)) = line.split_once(':') else {
                            continue;
                        };
                        match name.trim().to_ascii_lowercase().as_str() {
                            "content-length" => length = value.trim().parse().unwrap_or(0),
                            "authorization" => authorization.push(value.trim().to_owned()),
                            _ => {}
                        }
                    }
                    while buf.len() < head_end + length {
                        let mut chunk = [0u8; 4096];
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..head_end + length);
                    record.lock().unwrap().push((path, authorization));
                    let answer =
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                    if socket.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, seen)
}

const DONE: &str = "SELECT count(*) FROM outbox WHERE status = 'done'";

/// Runs a relay with `vars` until the rows enqueued are done, and returns
/// what the two downstreams saw, by path.
async fn relay_through(env: &Env, vars: &[(&str, &str)]) -> Vec<(String, Vec<String>)> {
    let (fulfilment, fulfilment_seen) = recording_downstream().await;
    let (email, email_seen) = recording_downstream().await;
    let mut all = vec![
        ("FULFILMENT_URL", fulfilment.as_str()),
        ("EMAIL_URL", email.as_str()),
        ("RELAY_POLL_INTERVAL_MS", "50"),
    ];
    all.extend_from_slice(vars);
    let before = env.count(DONE).await;
    let order = before + 1;
    env.enqueue("ship_order", order, &format!("evt_{order}")).await;
    env.enqueue("send_confirmation", order, &format!("evt_{order}"))
        .await;
    let relay = env.spawn_relay(&all);
    env.wait_for(DONE, before + 2, Duration::from_secs(15)).await;
    relay.signal("TERM");
    let (code, stderr) = relay.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{stderr}");
    let mut seen = fulfilment_seen.lock().unwrap().clone();
    seen.extend(email_seen.lock().unwrap().iter().cloned());
    seen.sort();
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_endpoint_gets_its_own_authorization_and_none_when_unset() {
    let env = env().await;
    let both = relay_through(
        &env,
        &[
            ("FULFILMENT_AUTHORIZATION", "Bearer fulfilment-t0ken"),
            ("EMAIL_AUTHORIZATION", "Basic ZW1haWw6cGFzcw=="),
        ],
    )
    .await;
    assert_eq!(
        both,
        vec![
            ("/emails".to_owned(), vec!["Basic ZW1haWw6cGFzcw==".to_owned()]),
            (
                "/shipments".to_owned(),
                vec!["Bearer fulfilment-t0ken".to_owned()]
            ),
        ],
        "each endpoint gets its own Authorization, verbatim, once"
    );
    let fulfilment_only =
        relay_through(&env, &[("FULFILMENT_AUTHORIZATION", "Bearer fulfilment-t0ken")]).await;
    assert_eq!(
        fulfilment_only,
        vec![
            ("/emails".to_owned(), vec![]),
            (
                "/shipments".to_owned(),
                vec!["Bearer fulfilment-t0ken".to_owned()]
            ),
        ],
        "no Authorization header where none is configured"
    );
}

/// A closed port: every call fails at connect, with nothing listening.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_show_in_rows_logs_or_operator_output() {
    const SECRET: &str = "s3cret";
    let env = env().await;
    let fulfilment = format!("http://ops:{SECRET}@127.0.0.1:{}", closed_port());
    let email = format!("http://127.0.0.1:{}/v1", closed_port());
    let vars = [
        ("DATABASE_URL", env.relay_url.as_str()),
        ("FULFILMENT_URL", fulfilment.as_str()),
        ("EMAIL_URL", email.as_str()),
        ("EMAIL_AUTHORIZATION", "Bearer t0ken-s3cret"),
        ("ADMIN_LISTEN_ADDR", "127.0.0.1:0"),
        ("RELAY_MAX_ATTEMPTS", "1"),
        ("RELAY_POLL_INTERVAL_MS", "50"),
        ("RELAY_HTTP_TIMEOUT_MS", "1000"),
        ("RELAY_PRUNE_INTERVAL_SECS", "0"),
        ("LOG_FORMAT", "json"),
        ("RUST_LOG", "debug"),
    ];
    let ship = env.enqueue("ship_order", 1, "evt_1").await;
    let email_row = env.enqueue("send_confirmation", 1, "evt_1").await;

    // The worker, its log (stdout) and stderr to files.
    let dir = std::env::temp_dir().join(format!("relay-credentials-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (log_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
    cmd.envs(vars)
        .stdout(Stdio::from(std::fs::File::create(&log_path).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(&err_path).unwrap()));
    let relay = crate::helpers::RelayProcess(cmd.spawn().unwrap());
    env.wait_for(
        "SELECT count(*) FROM outbox WHERE status = 'dead'",
        2,
        Duration::from_secs(15),
    )
    .await;
    relay.signal("TERM");
    let (code, _) = relay.wait(Duration::from_secs(10));
    let log = std::fs::read_to_string(&log_path).unwrap() + &std::fs::read_to_string(&err_path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("downstream call finished"), "{log}");
    assert!(
        !log.contains(SECRET),
        "the relay's log shows a credential:\n{log}"
    );

    for id in [ship, email_row] {
        let (status, _, last_error) = env.row_status(id).await;
        let last_error = last_error.unwrap_or_default();
        assert_eq!(status, "dead", "{last_error}");
        assert!(!last_error.is_empty());
        assert!(
            !last_error.contains(SECRET),
            "last_error shows a credential: {last_error}"
        );
    }

    for args in [
        &["dead", "list"][..],
        &["dead", "list", "--json"],
        &["stats"],
        &["stats", "--json"],
        &["--help"],
        &["dead", "list", "--help"],
        &["stats", "--help"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
            .args(args)
            .envs(vars)
            .output()
            .unwrap();
        let shown = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {shown}");
        assert!(!shown.contains(SECRET), "{args:?} shows a credential:\n{shown}");
    }
}
