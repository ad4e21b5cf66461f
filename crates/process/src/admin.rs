//! The admin listener (`ADMIN_LISTEN_ADDR`), apart from any traffic port so it
//! can be exposed to the monitoring namespace only:
//! - `/healthz`: liveness. 200 while the process serves; it checks nothing
//!   else, so a database outage never gets pods restarted in a loop.
//! - `/readyz`: readiness. The service's own check (database reachable, schema
//!   current, ...): 200 `ready`, or 503 with the reason on one line.
//! - `/metrics`: the Prometheus registry, OpenMetrics text.

use std::future::Future;
use std::net::TcpListener;
use std::pin::Pin;
use std::sync::Arc;

use actix_web::{App, HttpResponse, HttpServer, web};
use anyhow::Context as _;
use prometheus_client::registry::Registry;

/// A readiness check: `Ok` when ready, else why not.
pub type Readiness = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

struct AdminState {
    readiness: Readiness,
    registry: Arc<Registry>,
}

/// A bound admin server; `run` serves until the handle stops it.
pub struct AdminServer {
    server: actix_web::dev::Server,
    port: u16,
}

impl AdminServer {
    /// Binds now (so a taken port fails at start-up, the error naming
    /// `ADMIN_LISTEN_ADDR`), serves once run.
    pub fn bind(addr: &str, readiness: Readiness, registry: Arc<Registry>) -> anyhow::Result<Self> {
        let listener =
            TcpListener::bind(addr).with_context(|| format!("binding ADMIN_LISTEN_ADDR {addr}"))?;
        let port = listener.local_addr()?.port();
        let state = web::Data::new(AdminState { readiness, registry });
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .route("/healthz", web::get().to(healthz))
                .route("/readyz", web::get().to(readyz))
                .route("/metrics", web::get().to(metrics))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1)
        .listen(listener)?
        .run();
        Ok(Self { server, port })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    pub async fn run(self) -> std::io::Result<()> {
        self.server.await
    }
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

async fn readyz(state: web::Data<AdminState>) -> HttpResponse {
    match (state.readiness)().await {
        Ok(()) => HttpResponse::Ok().content_type("text/plain").body("ready\n"),
        Err(reason) => HttpResponse::ServiceUnavailable()
            .content_type("text/plain")
            .body(format!("not ready: {reason}\n")),
    }
}

async fn metrics(state: web::Data<AdminState>) -> HttpResponse {
    let mut text = String::with_capacity(8 * 1024);
    if prometheus_client::encoding::text::encode(&mut text, &state.registry).is_err() {
        return HttpResponse::InternalServerError().finish();
    }
    HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(text)
}
