//! A fault-injecting TCP proxy: put it between a client and a server (the
//! relay and the simulated downstream) and break the network between them
//! without root, `tc` or iptables.
//!
//! It forwards bytes both ways, unchanged, and on demand:
//! - **delays** every chunk (`delay_ms`): past the client's timeout, the
//!   request still arrives, after the client gave up;
//! - **cuts** connections once the answer starts (`cut_after_bytes`,
//!   `cut_rate`): the server got the request and may have done the work,
//!   the client gets a reset instead of the answer;
//! - **black-holes** connections (`blackhole_rate`, `blackhole`): read and
//!   dropped, never answered, so the client times out;
//! - **refuses** connections (`refuse`): the listener is closed, as when the
//!   server is down, and open connections are reset.
//!
//! Which faults reach open connections and which only new ones is in
//! [`faults`]. It is TCP only and knows nothing of HTTP: a fault hits
//! whatever exchange is on the connection.
//!
//! Tests run it in process with [`spawn`] and change faults with
//! [`RunningProxy::set_faults`]; scripts run `simulator proxy`, which prints
//! `{"listening":"ADDR","control":"ADDR"}` and takes `POST /faults` on the
//! control address.
//!
//! # Endpoints (control address)
//! - `GET|POST /faults`: [`Faults`] as JSON; a POST replaces them all.
//! - `GET /stats`: [`Stats`]: connections, bytes, faults applied.
//! - `GET /healthz`.
//!
//! # Layout
//! - [`faults`]: the settings and each new connection's fate.
//! - `forward`: the accept loop and the per-connection pump.
//! - `http`: the control endpoints.
//! - [`stats`]: the counters and their snapshot.

pub mod faults;
mod forward;
mod http;
pub mod stats;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpServer, web};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use faults::Faults;
pub use stats::{Injected, Stats};

use stats::Counters;

/// How the proxy starts; mirrors the command-line flags.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Port 0 picks a free port; [`RunningProxy::addr`] tells which.
    pub listen: SocketAddr,
    /// Where connections are forwarded.
    pub upstream: SocketAddr,
    /// The control endpoints' address; `None` serves none (a test in process
    /// calls [`RunningProxy::set_faults`] instead).
    pub control: Option<SocketAddr>,
    /// The faults from the start.
    pub faults: Faults,
}

impl ProxyConfig {
    /// A fault-free proxy to `upstream` on a free loopback port, without
    /// control endpoints.
    pub fn new(upstream: SocketAddr) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            upstream,
            control: None,
            faults: Faults::default(),
        }
    }
}

/// What the accept loop, the connections and the control endpoints share.
pub(crate) struct Shared {
    /// The proxy's own address (bound again after `refuse`).
    addr: SocketAddr,
    upstream: SocketAddr,
    /// The faults now; every connection watches them.
    faults: watch::Sender<Faults>,
    counters: Counters,
}

impl Shared {
    fn faults(&self) -> Faults {
        self.faults.borrow().clone()
    }

    fn set_faults(&self, faults: Faults) -> Result<(), String> {
        faults.validate()?;
        tracing::info!(faults = %serde_json::to_string(&faults).unwrap_or_default(), "faults changed");
        self.faults.send_replace(faults);
        Ok(())
    }
}

/// A proxy forwarding on the caller's runtime (its control endpoints on
/// their own thread) until stopped or dropped.
pub struct RunningProxy {
    addr: SocketAddr,
    control: Option<SocketAddr>,
    shared: Arc<Shared>,
    stop: CancellationToken,
    accepting: tokio::task::JoinHandle<()>,
    connections: TaskTracker,
    control_server: Option<ControlServer>,
}

struct ControlServer {
    handle: ServerHandle,
    server: tokio::task::JoinHandle<io::Result<()>>,
}

/// Binds both addresses and starts forwarding. Must be called within a Tokio
/// runtime: connections are tasks on it, so a caller that blocks a
/// current-thread runtime stalls them (tests that also block use a
/// multi-thread runtime).
pub async fn spawn(config: ProxyConfig) -> io::Result<RunningProxy> {
    config
        .faults
        .validate()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    let shared = Arc::new(Shared {
        addr,
        upstream: config.upstream,
        faults: watch::Sender::new(config.faults),
        counters: Counters::default(),
    });
    let (control, control_server) = match config.control {
        Some(control) => {
            let (control, server) = serve_control(control, shared.clone())?;
            (Some(control), Some(server))
        }
        None => (None, None),
    };
    let stop = CancellationToken::new();
    let connections = TaskTracker::new();
    let accepting = tokio::spawn(forward::accept_loop(
        listener,
        shared.clone(),
        connections.clone(),
        stop.clone(),
    ));
    Ok(RunningProxy {
        addr,
        control,
        shared,
        stop,
        accepting,
        connections,
        control_server,
    })
}

fn serve_control(addr: SocketAddr, shared: Arc<Shared>) -> io::Result<(SocketAddr, ControlServer)> {
    let listener = std::net::TcpListener::bind(addr)?;
    let addr = listener.local_addr()?;
    let data = web::Data::new(shared);
    let server = HttpServer::new(move || App::new().app_data(data.clone()).configure(http::routes))
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1)
        .listen(listener)?
        .run();
    let handle = server.handle();
    Ok((
        addr,
        ControlServer {
            handle,
            server: tokio::spawn(server),
        },
    ))
}

impl RunningProxy {
    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, what the relay's `FULFILMENT_URL` and `EMAIL_URL` take.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The control endpoints' address, if served.
    pub fn control_addr(&self) -> Option<SocketAddr> {
        self.control
    }

    pub fn faults(&self) -> Faults {
        self.shared.faults()
    }

    /// As `POST /faults`: replaces them all, from the next chunk of every
    /// open connection on.
    pub fn set_faults(&self, faults: Faults) -> Result<(), String> {
        self.shared.set_faults(faults)
    }

    /// As `GET /stats`.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// Forwards until `shutdown` completes, then stops.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) {
        shutdown.await;
        self.stop().await;
    }

    /// Stops accepting, closes every connection (black holes included) and
    /// the control endpoints, and returns once they are closed.
    pub async fn stop(mut self) {
        self.stop.cancel();
        let _ = (&mut self.accepting).await;
        self.connections.close();
        self.connections.wait().await;
        if let Some(control) = self.control_server.take() {
            control.handle.stop(true).await;
            let _ = control.server.await;
        }
    }
}

impl Drop for RunningProxy {
    /// A forgotten proxy does not keep forwarding after its owner is gone.
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(control) = &self.control_server {
            // The command is sent now; there is nothing to wait for.
            drop(control.handle.stop(false));
        }
    }
}
