//! The data plane: the accept loop, and one task per connection that pumps
//! bytes both ways and applies the faults between a read and its write.
//!
//! A connection is one task with one loop over both directions (not two
//! halves copying on their own), so a fault decided on one side (a cut on
//! the answer, a black hole) closes or silences both at once, and a change
//! of the faults reaches an idle keep-alive connection at once too. Each
//! read is written whole before the next read, which is all an HTTP/1.1
//! exchange needs and keeps a delay per chunk simple. A half-close is
//! forwarded as a half-close; any error on either side resets both.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Shared;
use super::faults::{Fate, Faults};
use super::stats::Counters;

/// Bytes read per chunk.
const CHUNK: usize = 16 * 1024;

/// Connecting to the upstream on loopback takes microseconds; this bound
/// only matters when the upstream itself is gone.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a black hole holds a connection its client has closed (or
/// half-closed): longer than any client timeout in our tests and scripts.
const BLACKHOLE_HOLD: Duration = Duration::from_secs(60);

/// The pause before binding a closed listener again while its address is
/// taken, and before accepting again after a failed accept.
const REBIND_PAUSE: Duration = Duration::from_millis(20);

/// Accepts until `stop`; closes the listener while `refuse` is set and binds
/// the same address again once it is not.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    connections: TaskTracker,
    stop: CancellationToken,
) {
    let addr = shared.addr;
    let mut faults = shared.faults.subscribe();
    let mut listener = Some(listener);
    loop {
        let refuse = faults.borrow_and_update().refuse;
        if refuse && listener.is_some() {
            // Dropping the socket closes it: the kernel answers new SYNs
            // with RST, and connections still in the backlog are reset.
            listener = None;
            Counters::count(&shared.counters.refusals, 1);
            tracing::info!(%addr, "refusing connections");
        } else if !refuse && listener.is_none() {
            listener = match rebind(addr, &mut faults, &stop).await {
                Rebound::Listening(l) => Some(l),
                Rebound::Refuse => continue,
                Rebound::Stopped => return,
            };
            tracing::info!(%addr, "accepting connections again");
        }
        tokio::select! {
            () = stop.cancelled() => return,
            changed = faults.changed() => if changed.is_err() { return },
            accepted = accept(listener.as_ref()) => match accepted {
                Ok((socket, _peer)) => {
                    connections.spawn(serve(socket, shared.clone(), stop.clone()));
                }
                Err(e) => {
                    // Out of descriptors, or a connection reset before it
                    // was accepted: nothing to do but pause and go on.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(REBIND_PAUSE).await;
                }
            },
        }
    }
}

async fn accept(listener: Option<&TcpListener>) -> io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

enum Rebound {
    Listening(TcpListener),
    Refuse,
    Stopped,
}

/// Binds `addr` again (tokio sets `SO_REUSEADDR`, so connections of the
/// previous listener in `TIME_WAIT` are no obstacle), retrying while the
/// port is taken, until `refuse` comes back or `stop`.
async fn rebind(addr: SocketAddr, faults: &mut watch::Receiver<Faults>, stop: &CancellationToken) -> Rebound {
    let mut failures = 0u32;
    loop {
        if stop.is_cancelled() {
            return Rebound::Stopped;
        }
        if faults.borrow_and_update().refuse {
            return Rebound::Refuse;
        }
        match TcpListener::bind(addr).await {
            Ok(listener) => return Rebound::Listening(listener),
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(50) {
                    tracing::warn!(%addr, error = %e, "binding the listener again failed; retrying");
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return Rebound::Stopped,
            _ = tokio::time::sleep(REBIND_PAUSE) => {}
        }
    }
}

/// One client connection, from accept to close.
async fn serve(client: TcpStream, shared: Arc<Shared>, stop: CancellationToken) {
    let counters = &shared.counters;
    let _open = counters.opened();
    let mut faults = shared.faults.subscribe();
    let now = faults.borrow_and_update().clone();
    if now.refuse {
        // Accepted just as the listener was being closed.
        Counters::count(&counters.refused_resets, 1);
        reset(&client);
        return;
    }
    let cut_at = match now.draw() {
        Fate::Blackhole => {
            Counters::count(&counters.blackholes, 1);
            return swallow(client, None, &stop).await;
        }
        Fate::Cut { after } => Some(after),
        Fate::Forward => None,
    };
    let connect = tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(shared.upstream));
    let Ok(Ok(upstream)) = connect.await else {
        Counters::count(&counters.upstream_failures, 1);
        reset(&client);
        return;
    };
    // Chunks are written as read; Nagle would only add delays of its own.
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let mut link = Link {
        client,
        upstream,
        cut_at,
        from_upstream: 0,
        counters,
        stop: &stop,
    };
    match link.pump(&mut faults).await {
        End::Closed => {}
        End::Broken => link.reset_both(),
        End::Cut => {
            Counters::count(&counters.cuts, 1);
            link.reset_both();
        }
        End::Refused => {
            Counters::count(&counters.refused_resets, 1);
            link.reset_both();
        }
        End::Blackhole => {
            Counters::count(&counters.blackholes, 1);
            swallow(link.client, Some(link.upstream), &stop).await;
        }
    }
}

/// How a forwarded connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Both sides closed (or the proxy stopped): a plain close.
    Closed,
    /// An error on either side: reset both.
    Broken,
    Cut,
    Refused,
    Blackhole,
}

/// Which way a chunk goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToUpstream,
    ToClient,
}

struct Link<'a> {
    client: TcpStream,
    upstream: TcpStream,
    /// This connection's own cut, drawn at accept.
    cut_at: Option<u64>,
    from_upstream: u64,
    counters: &'a Counters,
    stop: &'a CancellationToken,
}

impl Link<'_> {
    async fn pump(&mut self, faults: &mut watch::Receiver<Faults>) -> End {
        let mut from_client = vec![0u8; CHUNK];
        let mut from_upstream = vec![0u8; CHUNK];
        let (mut client_done, mut upstream_done) = (false, false);
        while !(client_done && upstream_done) {
            tokio::select! {
                () = self.stop.cancelled() => return End::Closed,
                changed = faults.changed() => {
                    if changed.is_err() {
                        return End::Closed;
                    }
                    let now = faults.borrow_and_update();
                    if now.refuse {
                        return End::Refused;
                    }
                    if now.blackhole {
                        return End::Blackhole;
                    }
                }
                read = self.client.read(&mut from_client), if !client_done => match read {
                    Ok(0) => {
                        client_done = true;
                        if self.upstream.shutdown().await.is_err() {
                            return End::Broken;
                        }
                    }
                    Ok(n) => {
                        let now = faults.borrow().clone();
                        if let Some(end) = self.forward(Direction::ToUpstream, &from_client[..n], &now).await {
                            return end;
                        }
                    }
                    Err(_) => return End::Broken,
                },
                read = self.upstream.read(&mut from_upstream), if !upstream_done => match read {
                    Ok(0) => {
                        upstream_done = true;
                        if self.client.shutdown().await.is_err() {
                            return End::Broken;
                        }
                    }
                    Ok(n) => {
                        let now = faults.borrow().clone();
                        if let Some(end) = self.forward(Direction::ToClient, &from_upstream[..n], &now).await {
                            return end;
                        }
                    }
                    Err(_) => return End::Broken,
                },
            }
        }
        End::Closed
    }

    /// Writes one chunk to the other side, applying the faults of the
    /// moment; `Some` ends the connection.
    async fn forward(&mut self, direction: Direction, chunk: &[u8], faults: &Faults) -> Option<End> {
        if faults.refuse {
            return Some(End::Refused);
        }
        if faults.blackhole {
            // The chunk is lost with everything after it.
            return Some(End::Blackhole);
        }
        let mut chunk = chunk;
        let mut cut = false;
        if direction == Direction::ToClient
            && let Some(limit) = self.cut_at.or(faults.cut_for_all())
            && self.from_upstream + chunk.len() as u64 > limit
        {
            let room = limit.saturating_sub(self.from_upstream);
            chunk = &chunk[..usize::try_from(room).unwrap_or(usize::MAX).min(chunk.len())];
            cut = true;
        }
        if faults.delay_ms > 0 && !chunk.is_empty() {
            Counters::count(&self.counters.delays, 1);
            tokio::select! {
                () = self.stop.cancelled() => return Some(End::Closed),
                () = tokio::time::sleep(Duration::from_millis(faults.delay_ms)) => {}
            }
        }
        let (to, counter) = match direction {
            Direction::ToUpstream => (&mut self.upstream, &self.counters.bytes_to_upstream),
            Direction::ToClient => (&mut self.client, &self.counters.bytes_to_client),
        };
        if !chunk.is_empty() {
            if to.write_all(chunk).await.is_err() {
                return Some(End::Broken);
            }
            Counters::count(counter, chunk.len() as u64);
        }
        if direction == Direction::ToClient {
            self.from_upstream += chunk.len() as u64;
        }
        cut.then_some(End::Cut)
    }

    fn reset_both(&self) {
        reset(&self.client);
        reset(&self.upstream);
    }
}

/// Makes the coming close a reset: `SO_LINGER` 0 sends RST instead of FIN,
/// so the peer sees "connection reset" rather than a clean end of stream.
fn reset(socket: &TcpStream) {
    let _ = socket2::SockRef::from(socket).set_linger(Some(Duration::ZERO));
}

/// A black hole: reads whatever either side sends and drops it, answers
/// nothing. An end of stream from the client is not answered either (a
/// black hole sends no FIN): a client that only half-closed keeps waiting
/// and times out. The socket is held [`BLACKHOLE_HOLD`] after that, then
/// reset, so that clients that closed for good do not leak descriptors. A
/// reset from the client, or the proxy stopping, ends it at once.
async fn swallow(mut client: TcpStream, mut upstream: Option<TcpStream>, stop: &CancellationToken) {
    let mut sink = vec![0u8; CHUNK];
    let mut upstream_sink = vec![0u8; CHUNK];
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            read = client.read(&mut sink) => match read {
                Ok(0) => break,
                Err(_) => return,
                Ok(_) => {}
            },
            read = read_some(upstream.as_mut(), &mut upstream_sink) => match read {
                Ok(0) | Err(_) => upstream = None,
                Ok(_) => {}
            },
        }
    }
    tokio::select! {
        () = stop.cancelled() => {}
        _ = tokio::time::sleep(BLACKHOLE_HOLD) => reset(&client),
    }
}

async fn read_some(socket: Option<&mut TcpStream>, buf: &mut [u8]) -> io::Result<usize> {
    match socket {
        Some(socket) => socket.read(buf).await,
        None => std::future::pending().await,
    }
}
