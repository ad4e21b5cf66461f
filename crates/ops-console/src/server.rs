//! Building and running the console: binds its listener and the admin
//! listener, then serves until the token is cancelled. Every response
//! carries headers that forbid framing, scripts and caching; the routes are
//! the pages (GET) and the actions (POST only).

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::dev::Service as _;
use actix_web::middleware::DefaultHeaders;
use actix_web::{App, HttpServer, web};
use anyhow::Context as _;
use process::{AdminServer, Readiness};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::auth::Sessions;
use crate::config::{Console, Settings};
use crate::metrics::ConsoleMetrics;
use crate::state::State;
use crate::{actions, login, pages};

/// The headers of every response: no framing (`frame-ancestors`,
/// `X-Frame-Options`), no script of any origin and no inline style
/// (`default-src 'none'`), forms posted only here, nothing cached, no referrer
/// leaving with an event id in it.
pub const SECURITY_HEADERS: [(&str, &str); 6] = [
    (
        "Content-Security-Policy",
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
];

pub struct Application {
    server: actix_web::dev::Server,
    port: u16,
    admin: AdminServer,
    pool: db::Pool,
}

impl Application {
    pub fn build(settings: &Settings, console: Console, database: &db::Database) -> anyhow::Result<Self> {
        let pool = database.pool(&db::ConnectOptions {
            application_name: "ops-console",
            statement_timeout: Some(std::time::Duration::from_secs(10)),
            lock_timeout: Some(std::time::Duration::from_secs(5)),
            abort_when_client_leaves: true,
            asynchronous_commit: false,
            generic_plans: false,
            index_paths: true,
            pool_size: 4,
            pool_wait: std::time::Duration::from_secs(10),
        });
        let mut registry = Registry::default();
        let metrics = ConsoleMetrics::register(&mut registry);
        process::metrics::register(
            &mut registry,
            "ops_console_build_info",
            env!("CARGO_PKG_VERSION"),
            &pool,
        );
        let readiness: Readiness = {
            let pool = pool.clone();
            Arc::new(move || {
                let pool = pool.clone();
                Box::pin(async move { db::ready::check(&pool).await })
            })
        };
        let admin = AdminServer::bind(
            &settings.admin.admin_listen_addr.to_string(),
            readiness,
            Arc::new(registry),
        )?;
        let listener = TcpListener::bind(console.listen)
            .with_context(|| format!("binding CONSOLE_LISTEN_ADDR {}", console.listen))?;
        let port = listener.local_addr()?.port();
        let state = web::Data::new(State {
            pool: pool.clone(),
            sessions: Sessions::new(console.token.expose(), console.session_ttl, console.cookie),
            console,
        });
        let server = HttpServer::new(move || {
            let headers = SECURITY_HEADERS
                .iter()
                .fold(DefaultHeaders::new(), |h, (name, value)| h.add((*name, *value)));
            let metrics = metrics.clone();
            App::new()
                .app_data(state.clone())
                // Every answer to an action, counted by what came of it.
                .wrap_fn(move |req, service| {
                    let metrics = metrics.clone();
                    let post = req.method() == actix_web::http::Method::POST;
                    let answer = service.call(req);
                    async move {
                        let answer = answer.await?;
                        if post && let Some(pattern) = answer.request().match_pattern() {
                            metrics.answered(&pattern, answer.status());
                        }
                        Ok(answer)
                    }
                })
                .app_data(web::FormConfig::default().limit(16 * 1024))
                .wrap(headers)
                .route("/style.css", web::get().to(pages::style))
                .service(
                    web::resource("/login")
                        .route(web::get().to(login::form))
                        .route(web::post().to(login::sign_in)),
                )
                .service(web::resource("/logout").route(web::post().to(login::sign_out)))
                .route("/", web::get().to(pages::home::backlog))
                .route("/search", web::get().to(pages::story::search))
                .route("/events/{id}", web::get().to(pages::story::event))
                .route("/orders/{id}", web::get().to(pages::story::order))
                .route("/dead", web::get().to(pages::dead::list))
                .service(web::resource("/dead/requeue").route(web::post().to(actions::requeue_kind)))
                .route("/dead/{id}", web::get().to(pages::dead::show))
                .service(web::resource("/dead/{id}/requeue").route(web::post().to(actions::requeue_one)))
                .service(web::resource("/dead/{id}/discard").route(web::post().to(actions::discard_dead)))
                .route("/unmatched", web::get().to(pages::unmatched::list))
                .service(web::resource("/events/{id}/replay").route(web::post().to(actions::replay)))
                .service(web::resource("/events/{id}/discard").route(web::post().to(actions::discard_event)))
                .default_service(web::to(pages::not_found))
        })
        .workers(2)
        .disable_signals()
        .shutdown_timeout(5)
        .listen(listener)?
        .run();
        Ok(Self {
            server,
            port,
            admin,
            pool,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn admin_port(&self) -> u16 {
        self.admin.port()
    }

    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        tokio::spawn(db::ready::announce(self.pool.clone()));
        let admin_handle = self.admin.handle();
        let admin = tokio::spawn(self.admin.run());
        let handle = self.server.handle();
        let server = tokio::spawn(self.server);
        shutdown.cancelled().await;
        handle.stop(true).await;
        admin_handle.stop(true).await;
        let _ = server.await;
        let _ = admin.await;
        self.pool.close();
        tracing::info!("ops-console stopped");
        Ok(())
    }
}
