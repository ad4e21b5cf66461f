//! Building and running the service: binds its listeners (so tests can ask
//! for port 0 and read the port back), then serves until the token is
//! cancelled, finishing the requests in flight.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{App, HttpServer, web};
use anyhow::Context as _;
use process::{AdminServer, Readiness};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::http::{self, AppState};
use crate::metrics::IngestMetrics;
use crate::notifier::Notifier;
use crate::reconcile::Reconciler;
use crate::record::Recorder;

pub struct Application {
    server: actix_web::dev::Server,
    port: u16,
    admin: AdminServer,
    pool: db::Pool,
    notifier: Arc<Notifier>,
    reconciler: Reconciler,
}

impl Application {
    /// Binds both listeners and prepares the pool (connections are made on
    /// demand, so a database that is down at start-up is not fatal: the
    /// service starts unready and becomes ready when the database is back).
    pub fn build(
        settings: &Settings,
        database: &db::Database,
        verifier: signature::Verifier,
    ) -> anyhow::Result<Self> {
        let deadline = settings.deadline();
        let pool = database.pool(&db::ConnectOptions {
            application_name: "webhook-ingest",
            // The server's own bound on a statement the deadline abandoned,
            // for when its cancel request is lost (a cancel is a new
            // connection, which a network or proxy may refuse). Equal to the
            // deadline, not above it: the server counts from the statement's
            // arrival, which is after the request's start, so it never ends
            // a statement the handler is still waiting for, and a statement
            // whose cancel was lost ends at most one deadline after the 503.
            statement_timeout: Some(deadline.whole()),
            lock_timeout: Some(deadline.lock_wait()),
            abort_when_client_leaves: true,
            // The 200 promises the provider the event is recorded: durable commits.
            asynchronous_commit: false,
            // Its statements have the same shape every time (the batch's arrays
            // would otherwise be planned on every execution): see db::ConnectOptions.
            generic_plans: true,
            index_paths: true,
            pool_size: settings.database_pool_size as usize,
            pool_wait: deadline.whole(),
        });

        let mut registry = Registry::default();
        let metrics = IngestMetrics::register(&mut registry);
        process::metrics::register(
            &mut registry,
            "webhook_ingest_build_info",
            env!("CARGO_PKG_VERSION"),
            &pool,
        );
        let notifier = Arc::new(Notifier::default());
        let reconciler = Reconciler::new(
            pool.clone(),
            notifier.clone(),
            metrics.clone(),
            settings.unmatched_horizon(),
        );
        let state = web::Data::new(AppState {
            verifier,
            deadline,
            metrics: metrics.clone(),
            in_flight: Arc::new(tokio::sync::Semaphore::new(
                settings.ingest_max_in_flight as usize,
            )),
            readers: Arc::new(tokio::sync::Semaphore::new(
                settings.ingest_max_in_flight as usize * http::READERS_PER_PERMIT,
            )),
            recorder: Recorder::new(database, pool.clone(), notifier.clone(), metrics, deadline),
        });

        let listener = TcpListener::bind(settings.ingest_listen_addr)
            .with_context(|| format!("binding INGEST_LISTEN_ADDR {}", settings.ingest_listen_addr))?;
        let port = listener.local_addr()?.port();
        let (workers, connections) = connection_bound(settings.ingest_max_in_flight as usize);
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .route(http::WEBHOOK_PATH, web::post().to(http::receive))
        })
        // Headers must arrive within the deadline too (slowloris).
        .client_request_timeout(deadline.whole())
        .client_disconnect_timeout(Duration::from_secs(1))
        .keep_alive(Duration::from_secs(75))
        .workers(workers)
        .max_connections(connections)
        // In-flight requests get their deadline to finish after SIGTERM.
        .shutdown_timeout(deadline.whole().as_secs() + 1)
        .disable_signals()
        .listen(listener)?
        .run();

        let admin = AdminServer::bind(
            &settings.admin.admin_listen_addr.to_string(),
            readiness(pool.clone()),
            Arc::new(registry),
        )?;
        Ok(Self {
            server,
            port,
            admin,
            pool,
            notifier,
            reconciler,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn admin_port(&self) -> u16 {
        self.admin.port()
    }

    /// Serves until `shutdown` is cancelled: then stops accepting, finishes
    /// the requests in flight (each bounded by its deadline) and returns.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        tokio::spawn(db::ready::announce(self.pool.clone()));
        let stop_notifier = CancellationToken::new();
        let notifier = {
            let (notifier, pool, stop) = (self.notifier.clone(), self.pool.clone(), stop_notifier.clone());
            tokio::spawn(async move { notifier.run(pool, stop).await })
        };
        let reconciler = {
            let (reconciler, stop) = (self.reconciler.clone(), stop_notifier.clone());
            tokio::spawn(async move { reconciler.run(stop).await })
        };
        let admin_handle = self.admin.handle();
        let admin = tokio::spawn(self.admin.run());
        let handle = self.server.handle();
        let stopper = tokio::spawn(async move {
            shutdown.cancelled().await;
            tracing::info!("stopping: no new requests, finishing those in flight");
            handle.stop(true).await;
        });
        let served = self.server.await;
        stopper.abort();
        // The last commits' NOTIFY: give it a moment, it is one round trip.
        tokio::time::sleep(Duration::from_millis(20)).await;
        stop_notifier.cancel();
        let _ = notifier.await;
        let _ = reconciler.await;
        admin_handle.stop(true).await;
        let _ = admin.await;
        self.pool.close();
        served.context("serving webhooks")
    }
}

/// The HTTP workers (one per CPU the process may use, as the runtime's:
/// `process::runtime::worker_threads`) and the connections
/// each holds at most: together, the bodies read at once
/// ([`http::READERS_PER_PERMIT`] per `INGEST_MAX_IN_FLIGHT` permit; an
/// HTTP/1.1 connection reads one at a time). A connection beyond that waits
/// in the listen backlog, in the kernel, until one closes: an open-loop
/// provider under overload opens one per delivery that finds none idle, and
/// each held one costs the ingest about 17 KiB of buffers (a peak RSS of
/// 168 MiB at 2b23aee, unbounded; 75.7 MiB at 9333ec3 with twice as many
/// held, 2,048 by default, in the full bench's overloaded e2e run).
fn connection_bound(max_in_flight: usize) -> (usize, usize) {
    let workers = process::runtime::worker_threads();
    let total = max_in_flight * http::READERS_PER_PERMIT;
    (workers, total.div_ceil(workers).max(1))
}

/// `/readyz`: the database half ([`db::ready::check`]); the first time it
/// passes, the pool is warmed first ([`crate::storage::warm`]), so that
/// traffic sent on the first ready answer finds no cold connection.
fn readiness(pool: db::Pool) -> Readiness {
    let warmed = Arc::new(tokio::sync::OnceCell::new());
    Arc::new(move || {
        let (pool, warmed) = (pool.clone(), warmed.clone());
        Box::pin(async move {
            db::ready::check(&pool).await?;
            warmed
                .get_or_init(|| async {
                    match crate::storage::warm(&pool).await {
                        Ok(connections) => tracing::info!(connections, "connection pool warmed"),
                        Err(e) => tracing::warn!(
                            error = %process::logs::error_chain(&e),
                            "could not warm the connection pool; connections open on demand"
                        ),
                    }
                })
                .await;
            Ok(())
        })
    })
}
