//! The simulated downstream APIs: fulfilment (`POST /shipments`) and email
//! (`POST /emails`) in one server, with Stripe-like idempotency keys and
//! faults to inject.
//!
//! # Idempotency
//! The first request for a key that succeeds creates one effect and stores
//! its status and body with a hash of the request body. The same key with
//! the same bytes gets that status and body again, byte for byte, with
//! `Idempotent-Replayed: true`; with other bytes, 422. A request that
//! arrives while another with its key is still being processed gets 409
//! (as Stripe answers; the relay retries 409) rather than waiting: the
//! simulator never parks a request on another's outcome. Injected failures
//! (5xx, 429, reset) create nothing and store nothing, so a retry can
//! succeed. A hang is the exception on purpose: see [`faults::Faults::hang_rate`].
//! `--no-idempotency` ignores keys: every request that gets through creates
//! an effect, which is how a double effect looks.
//!
//! # Endpoints
//! - `POST /shipments` `{"order_id": 1, "event_id": "..."}` → 201
//!   `{"shipment_id":"SHP-000001","order_id":1}`
//! - `POST /emails` `{"order_id": 1, "template": "order_confirmation" | "refund_notice",
//!   "event_id": "..."}` → 202 `{"email_id":"EML-000001","order_id":1,"template":"..."}`
//! - `GET /stats[?keys=false]`: [`Stats`].
//! - `GET|POST /control/faults`: [`Faults`] as JSON; a POST replaces them all.
//! - `POST /control/script` `{"key": "ship-1", "responses": [500, "reset", 200]}`.
//! - `POST /control/reset`: forget keys, scripts and stats (not the faults).
//! - `GET /healthz`.
//!
//! # Layout
//! - [`faults`]: fault settings, latency distributions, script entries.
//! - `state`: keys, effects and counters in sharded maps.
//! - `http`: the handlers, and dropping a connection without an answer.
//! - [`stats`]: the snapshot types.

pub mod faults;
mod http;
mod state;
pub mod stats;

use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::http::KeepAlive;
use actix_web::{App, HttpServer, web};

pub use faults::{Faults, Latency, ScriptStep};
pub use stats::{CallRecord, KeyStats, PathStats, Stats, TargetEffects};

use state::State;

/// How long an idle keep-alive connection stays open: longer than any
/// client pool's idle timeout (reqwest's is 90 s), so the client always
/// closes first and the only connection errors a client sees are injected.
const KEEP_ALIVE: Duration = Duration::from_secs(300);

/// How the downstream starts; mirrors the command-line flags.
#[derive(Debug, Clone)]
pub struct DownstreamConfig {
    /// Port 0 picks a free port; [`RunningDownstream::addr`] tells which.
    pub listen: SocketAddr,
    /// HTTP worker threads. One serves tens of thousands of loopback
    /// requests a second and leaves the other core of a 2-core machine to
    /// the relay and Postgres.
    pub workers: usize,
    /// `false` is `--no-idempotency`: an API without idempotency keys.
    pub idempotency: bool,
    pub faults: Faults,
}

impl Default for DownstreamConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            workers: 1,
            idempotency: true,
            faults: Faults::default(),
        }
    }
}

/// A downstream serving on its own worker threads until stopped (or dropped).
pub struct RunningDownstream {
    addr: SocketAddr,
    state: web::Data<State>,
    handle: ServerHandle,
    server: tokio::task::JoinHandle<io::Result<()>>,
}

/// Binds and starts serving. Must be called within a Tokio runtime; the
/// server runs on its own threads, so any runtime flavour will do.
pub async fn spawn(config: DownstreamConfig) -> io::Result<RunningDownstream> {
    config
        .faults
        .validate()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let listener = TcpListener::bind(config.listen)?;
    let addr = listener.local_addr()?;
    let state = web::Data::new(State::new(config.idempotency, config.faults));
    let app_state = state.clone();
    let server = HttpServer::new(move || App::new().app_data(app_state.clone()).configure(http::routes))
        .workers(config.workers.max(1))
        .keep_alive(KeepAlive::Timeout(KEEP_ALIVE))
        .on_connect(http::keep_socket)
        .disable_signals()
        // Nothing worth waiting for: a hung request would hold shutdown for a minute.
        .shutdown_timeout(1)
        .listen(listener)?
        .run();
    let handle = server.handle();
    Ok(RunningDownstream {
        addr,
        state,
        handle,
        server: tokio::spawn(server),
    })
}

impl RunningDownstream {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, what the relay's `FULFILMENT_URL` and `EMAIL_URL` take.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Everything, per-key stats included (`GET /stats`).
    pub fn stats(&self) -> Stats {
        self.state.snapshot(true)
    }

    /// The totals only (`GET /stats?keys=false`).
    pub fn totals(&self) -> Stats {
        self.state.snapshot(false)
    }

    pub fn faults(&self) -> Faults {
        (*self.state.faults()).clone()
    }

    /// As `POST /control/faults`.
    pub fn set_faults(&self, faults: Faults) -> Result<(), String> {
        faults.validate()?;
        self.state.set_faults(faults);
        Ok(())
    }

    /// As `POST /control/script`: the next requests with `key` get these
    /// steps in order, replacing any script the key had.
    pub fn script(&self, key: &str, steps: impl IntoIterator<Item = ScriptStep>) {
        self.state.set_script(key, steps.into_iter().collect());
    }

    /// As `POST /control/reset`.
    pub fn reset(&self) {
        self.state.reset();
    }

    /// Serves until `shutdown` completes (or the server fails), then stops.
    pub async fn run_until(mut self, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        tokio::select! {
            () = shutdown => {}
            served = &mut self.server => return served.map_err(io::Error::other)?,
        }
        self.handle.stop(true).await;
        self.join().await
    }

    /// Stops accepting, gives requests in flight a second, and returns.
    pub async fn stop(mut self) {
        self.handle.stop(true).await;
        let _ = self.join().await;
    }

    async fn join(&mut self) -> io::Result<()> {
        (&mut self.server).await.map_err(io::Error::other)?
    }
}

impl Drop for RunningDownstream {
    /// A forgotten downstream does not outlive its owner's threads.
    fn drop(&mut self) {
        // The command is sent now; there is nothing to wait for.
        drop(self.handle.stop(false));
    }
}
