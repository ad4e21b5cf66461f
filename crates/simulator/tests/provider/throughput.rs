//! What the generator itself costs: `simulator provider` against a server
//! that answers 200 at once, its own CPU time read from the summary.
//! Ignored by default; run it in release:
//! `cargo test --release -p simulator --test provider -- --ignored --nocapture throughput`.

use std::net::TcpListener;

use actix_web::{App, HttpResponse, HttpServer, web};
use simulator::provider::Summary;
use tokio::process::Command;

use crate::helpers::STANDARD_SECRET;

const BIN: &str = env!("CARGO_BIN_EXE_simulator");

/// A server that does nothing but answer like the ingest, on its own
/// thread, so what the child process spends is the generator alone. It
/// reads the body, as the ingest does: actix closes a connection whose
/// request body was left unread, and the generator would then measure
/// TCP handshakes instead of requests.
fn trivial_server() -> (String, actix_web::dev::ServerHandle) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = HttpServer::new(|| {
        App::new().default_service(web::to(|_body: web::Bytes| async {
            HttpResponse::Ok()
                .content_type("application/json")
                .body(r#"{"event_id":"evt","status":"processed","order_id":1}"#)
        }))
    })
    .workers(1)
    .disable_signals()
    .listen(listener)
    .unwrap()
    .run();
    let handle = server.handle();
    tokio::spawn(server);
    (url, handle)
}

#[tokio::test]
#[ignore = "a measurement, not a test: run in release with --ignored --nocapture"]
async fn throughput() {
    let (url, _server) = trivial_server();
    for concurrency in ["1", "16", "64"] {
        let output = Command::new(BIN)
            .args(["provider", "--target", &url, "--secret", STANDARD_SECRET])
            .args([
                "--concurrency",
                concurrency,
                "--duration-secs",
                "5",
                "--json",
                "--no-progress",
            ])
            .output()
            .await
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let s: Summary = serde_json::from_slice(&output.stdout).unwrap();
        let cpu = s.cpu_secs.unwrap_or(f64::NAN);
        println!(
            "concurrency {concurrency:>2}: {:>7.0} deliveries/s, p50 {:.3} ms, p99 {:.3} ms; \
             generator CPU {:.2} s over {:.2} s ({:.0}% of a core), {:.1} us per delivery",
            s.deliveries_per_sec,
            s.latency_ms.p50,
            s.latency_ms.p99,
            cpu,
            s.elapsed_secs,
            100.0 * cpu / s.elapsed_secs,
            1e6 * cpu / s.deliveries as f64
        );
    }
}
