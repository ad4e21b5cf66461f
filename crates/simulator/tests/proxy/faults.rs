//! Each fault, between a real client and a real server: what the client
//! sees, what the server saw.

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use simulator::proxy::Faults;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::helpers::{client, env, eventually, exchange, raw_server, ship, spawn_proxy};

#[tokio::test]
async fn a_delay_holds_back_each_direction() {
    let env = env(Faults {
        delay_ms: 250,
        ..Faults::default()
    })
    .await;
    let http = client(Duration::from_secs(5));
    let started = Instant::now();
    assert_eq!(ship(&http, &env.proxy.url(), 1).await.unwrap(), 201);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(2500),
        "request and answer each held back 250 ms: {took:?}"
    );
    assert!(env.proxy.stats().injected.delays >= 2);

    env.proxy.set_faults(Faults::default()).unwrap();
    let started = Instant::now();
    assert_eq!(ship(&http, &env.proxy.url(), 2).await.unwrap(), 201);
    assert!(started.elapsed() < Duration::from_millis(250), "healed");
}

#[tokio::test]
async fn a_delay_past_the_clients_timeout_still_delivers_the_request_late() {
    let env = env(Faults {
        delay_ms: 400,
        ..Faults::default()
    })
    .await;
    let http = client(Duration::from_millis(200));
    let err = ship(&http, &env.proxy.url(), 1).await.unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(env.downstream.stats().requests, 0, "not yet");
    // The client gave up; the request was on its way and arrives anyway,
    // and the server does the work nobody will hear about.
    eventually("the late request", Duration::from_secs(3), || {
        env.downstream.stats().effects == 1
    })
    .await;
}

#[tokio::test]
async fn a_cut_at_the_answer_loses_the_answer_not_the_work() {
    let env = env(Faults {
        cut_after_bytes: Some(0),
        ..Faults::default()
    })
    .await;
    let http = client(Duration::from_secs(5));
    let err = ship(&http, &env.proxy.url(), 1).await.unwrap_err();
    assert!(!err.is_timeout(), "a reset, at once: {err:?}");
    let downstream = env.downstream.stats();
    assert_eq!(
        (downstream.requests, downstream.effects),
        (1, 1),
        "the work was done"
    );
    let stats = env.proxy.stats();
    assert_eq!((stats.injected.cuts, stats.bytes_to_client), (1, 0));
    assert!(stats.bytes_to_upstream > 0);

    // The retry with the same key, once healed, learns the outcome.
    env.proxy.set_faults(Faults::default()).unwrap();
    assert_eq!(ship(&http, &env.proxy.url(), 1).await.unwrap(), 201);
    let downstream = env.downstream.stats();
    assert_eq!(
        (downstream.requests, downstream.effects, downstream.replays),
        (2, 1, 1)
    );
}

#[tokio::test]
async fn a_cut_after_n_bytes_passes_n_then_resets() {
    let server = raw_server(|_| vec![b'x'; 1000]).await;
    let proxy = spawn_proxy(
        server.addr,
        Faults {
            cut_after_bytes: Some(100),
            ..Faults::default()
        },
    )
    .await;
    let (answer, error) = exchange(proxy.addr(), b"request").await;
    assert_eq!(error.map(|e| e.kind()), Some(ErrorKind::ConnectionReset));
    assert!(answer.len() <= 100, "{} bytes", answer.len());
    assert_eq!(server.received.lock().unwrap()[0], b"request");
    let stats = proxy.stats();
    assert_eq!((stats.injected.cuts, stats.bytes_to_client), (1, 100));
}

#[tokio::test]
async fn a_cut_reaches_an_open_keep_alive_connection() {
    let env = env(Faults::default()).await;
    let http = client(Duration::from_secs(5));
    assert_eq!(ship(&http, &env.proxy.url(), 1).await.unwrap(), 201);
    env.proxy
        .set_faults(Faults {
            cut_after_bytes: Some(0),
            ..Faults::default()
        })
        .unwrap();
    assert!(ship(&http, &env.proxy.url(), 2).await.is_err());
    let stats = env.proxy.stats();
    assert_eq!((stats.connections, stats.injected.cuts), (1, 1), "{stats:?}");
    assert_eq!(env.downstream.stats().effects, 2);
}

#[tokio::test]
async fn rates_pick_a_share_of_new_connections() {
    let server = raw_server(|got| got.to_vec()).await;
    let proxy = spawn_proxy(
        server.addr,
        Faults {
            cut_rate: 0.4,
            blackhole_rate: 0.3,
            ..Faults::default()
        },
    )
    .await;
    // All at once: a black-holed connection costs the whole timeout.
    let n = 60;
    let outcomes = futures_util::future::join_all((0..n).map(|_| async {
        let mut socket = TcpStream::connect(proxy.addr()).await.unwrap();
        let _ = socket.write_all(b"ping").await;
        let _ = socket.shutdown().await;
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(1), socket.read_to_end(&mut got)).await;
        (read.map(|r| r.map_err(|e| e.kind())), got)
    }))
    .await;
    let (mut whole, mut cut, mut silent) = (0, 0, 0);
    for outcome in outcomes {
        match outcome {
            (Ok(Ok(_)), got) if got == b"ping" => whole += 1,
            (Ok(Err(ErrorKind::ConnectionReset)), _) => cut += 1,
            (Err(_), _) => silent += 1,
            other => panic!("unexpected: {other:?}"),
        }
    }
    assert_eq!(whole + cut + silent, n);
    assert!(
        whole > 5 && cut > 5 && silent > 5,
        "{whole} whole, {cut} cut, {silent} silent"
    );
    let stats = proxy.stats();
    assert_eq!((stats.injected.cuts, stats.injected.blackholes), (cut, silent));
    assert_eq!(
        server.received.lock().unwrap().len() as u64,
        whole + cut,
        "a black-holed connection never reaches the server"
    );
}

#[tokio::test]
async fn a_black_hole_times_the_client_out_and_nothing_reaches_the_server() {
    let env = env(Faults {
        blackhole: true,
        ..Faults::default()
    })
    .await;
    let http = client(Duration::from_millis(300));
    let started = Instant::now();
    let err = ship(&http, &env.proxy.url(), 1).await.unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(env.downstream.stats().requests, 0);
    let stats = env.proxy.stats();
    assert_eq!((stats.injected.blackholes, stats.bytes_to_upstream), (1, 0));
    // The client gave up and closed; a black hole says nothing back, not
    // even a FIN, and holds the connection a while.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(env.proxy.stats().open, 1);
}

#[tokio::test]
async fn a_black_hole_swallows_open_connections_until_the_client_gives_up() {
    let env = env(Faults::default()).await;
    let http = client(Duration::from_millis(300));
    assert_eq!(ship(&http, &env.proxy.url(), 1).await.unwrap(), 201);
    env.proxy
        .set_faults(Faults {
            blackhole: true,
            ..Faults::default()
        })
        .unwrap();
    let err = ship(&http, &env.proxy.url(), 2).await.unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    let stats = env.proxy.stats();
    assert_eq!(
        (stats.connections, stats.injected.blackholes),
        (1, 1),
        "{stats:?}"
    );
    assert_eq!(env.downstream.stats().requests, 1, "the second request was lost");

    env.proxy.set_faults(Faults::default()).unwrap();
    assert_eq!(ship(&http, &env.proxy.url(), 2).await.unwrap(), 201);
    assert_eq!(env.proxy.stats().connections, 2, "healed, on a new connection");
}

#[tokio::test]
async fn refusing_closes_the_listener_resets_open_connections_and_heals_on_the_same_port() {
    let env = env(Faults::default()).await;
    let addr = env.proxy.addr();
    let mut open = TcpStream::connect(addr).await.unwrap();
    eventually("accepted", Duration::from_secs(2), || env.proxy.stats().open == 1).await;

    env.proxy
        .set_faults(Faults {
            refuse: true,
            ..Faults::default()
        })
        .unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(2), open.read(&mut buf))
        .await
        .expect("the open connection ends at once");
    assert_eq!(read.map_err(|e| e.kind()), Err(ErrorKind::ConnectionReset));
    eventually("the listener closed", Duration::from_secs(2), || {
        env.proxy.stats().injected.refusals == 1
    })
    .await;
    let refused = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
    let http = client(Duration::from_secs(2));
    let err = ship(&http, &env.proxy.url(), 1).await.unwrap_err();
    assert!(err.is_connect(), "{err:?}");

    env.proxy.set_faults(Faults::default()).unwrap();
    let started = Instant::now();
    loop {
        match ship(&http, &env.proxy.url(), 1).await {
            Ok(status) => {
                assert_eq!(status, 201);
                break;
            }
            Err(e) => assert!(started.elapsed() < Duration::from_secs(2), "still refused: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = env.proxy.stats();
    assert_eq!(stats.injected.refused_resets, 1);
    assert_eq!(env.downstream.stats().requests, 1);
}
