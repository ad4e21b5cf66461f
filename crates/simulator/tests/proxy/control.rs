//! The control endpoints, and stopping.

use std::time::Duration;

use simulator::proxy::{self, Faults, ProxyConfig, Stats};
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;

use crate::helpers::{client, eventually, raw_server, ship};

#[tokio::test]
async fn faults_and_stats_over_http() {
    let downstream = simulator::downstream::spawn(Default::default()).await.unwrap();
    let proxy = proxy::spawn(ProxyConfig {
        control: Some("127.0.0.1:0".parse().unwrap()),
        ..ProxyConfig::new(downstream.addr())
    })
    .await
    .unwrap();
    let control = format!("http://{}", proxy.control_addr().unwrap());
    let http = client(Duration::from_secs(5));
    let post = |body: &'static str| {
        let http = http.clone();
        let url = format!("{control}/faults");
        async move { http.post(url).body(body).send().await.unwrap() }
    };

    let set = post(r#"{"delay_ms": 5, "cut_rate": 0.25}"#).await;
    assert_eq!(set.status(), 200);
    let expected = Faults {
        delay_ms: 5,
        cut_rate: 0.25,
        ..Faults::default()
    };
    assert_eq!(proxy.faults(), expected);
    let got: Faults = http
        .get(format!("{control}/faults"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got, expected);

    // Omitted fields go back to their defaults; an empty body heals.
    assert_eq!(post(r#"{"blackhole_rate": 0.1}"#).await.status(), 200);
    assert_eq!((proxy.faults().delay_ms, proxy.faults().blackhole_rate), (0, 0.1));
    assert_eq!(post("").await.status(), 200);
    assert_eq!(proxy.faults(), Faults::default());

    for bad in [
        r#"{"cut_rate": 2}"#,
        r#"{"cut_rate": 0.6, "blackhole_rate": 0.6}"#,
        r#"{"delay": 5}"#,
        r#"{"delay_ms": -1}"#,
        "nope",
    ] {
        let refused = post(bad).await;
        assert_eq!(refused.status(), 400, "{bad}");
        let body: serde_json::Value = refused.json().await.unwrap();
        assert!(body["error"].is_string(), "{bad}: {body}");
    }
    assert_eq!(
        proxy.faults(),
        Faults::default(),
        "nothing changed by a refused POST"
    );

    assert_eq!(ship(&http, &proxy.url(), 1).await.unwrap(), 201);
    let json: serde_json::Value = http
        .get(format!("{control}/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for field in [
        "connections",
        "open",
        "upstream_failures",
        "bytes_to_upstream",
        "bytes_to_client",
        "injected",
    ] {
        assert!(json.get(field).is_some(), "{field} missing from {json}");
    }
    for field in ["delays", "cuts", "blackholes", "refusals", "refused_resets"] {
        assert!(
            json["injected"].get(field).is_some(),
            "{field} missing from {json}"
        );
    }
    let stats: Stats = serde_json::from_value(json).unwrap();
    assert_eq!(stats.connections, 1);
    assert_eq!(stats, proxy.stats());

    let unknown = http.get(format!("{control}/nowhere")).send().await.unwrap();
    assert_eq!(unknown.status(), 404);
    assert_eq!(
        http.get(format!("{control}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn bad_faults_at_start_are_refused() {
    let err = proxy::spawn(ProxyConfig {
        faults: Faults {
            blackhole_rate: 1.5,
            ..Faults::default()
        },
        ..ProxyConfig::new("127.0.0.1:9".parse().unwrap())
    })
    .await
    .err()
    .expect("refused");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("blackhole_rate"), "{err}");
}

#[tokio::test]
async fn stop_closes_every_connection_black_holes_included() {
    let server = raw_server(|got| got.to_vec()).await;
    let proxy = proxy::spawn(ProxyConfig::new(server.addr)).await.unwrap();
    let addr = proxy.addr();
    let mut forwarded = TcpStream::connect(addr).await.unwrap();
    eventually("accepted", Duration::from_secs(2), || proxy.stats().open == 1).await;
    proxy
        .set_faults(Faults {
            blackhole_rate: 1.0,
            ..Faults::default()
        })
        .unwrap();
    let mut holed = TcpStream::connect(addr).await.unwrap();
    eventually("black-holed", Duration::from_secs(2), || {
        proxy.stats().injected.blackholes == 1
    })
    .await;

    tokio::time::timeout(Duration::from_secs(3), proxy.stop())
        .await
        .expect("stops at once");
    let mut buf = [0u8; 8];
    for socket in [&mut forwarded, &mut holed] {
        let read = tokio::time::timeout(Duration::from_secs(1), socket.read(&mut buf))
            .await
            .expect("closed");
        assert_eq!(read.unwrap(), 0);
    }
    assert!(TcpStream::connect(addr).await.is_err(), "no longer listening");
}
