//! The services' connection pools, and how their connections reach Postgres:
//! directly (or through a session-mode pooler), or through a transaction-mode
//! pooler such as PgBouncer with `pool_mode = transaction`
//! (`DATABASE_POOL_MODE`).
//!
//! The mode belongs to the pool, and a pooled [`Client`] carries it, so the
//! statements run on it ([`crate::Sql`]) are sent the right way without any
//! caller having to know.

use deadpool_postgres::{Manager, ManagerConfig, RecyclingMethod, Runtime};

use crate::connect::{ConnectOptions, Database};
use crate::mode::PoolMode;

impl Database {
    /// A pool of connections to this database with `options`' session
    /// settings, size and wait, in this database's [`PoolMode`].
    pub fn pool(&self, options: &ConnectOptions) -> Pool {
        let manager = Manager::from_config(
            self.config_for(options),
            self.tls().clone(),
            ManagerConfig {
                // A broken connection surfaces as an error on first use and
                // is then discarded; checking every checkout would cost a
                // round trip per request.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(options.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.pool_wait))
            .create_timeout(Some(options.pool_wait))
            .recycle_timeout(Some(options.pool_wait))
            .build()
            .expect("a pool with a runtime and timeouts always builds");
        Pool::new(pool, self.pool_mode())
    }
}

/// A pool of connections, all of one [`PoolMode`].
#[derive(Clone)]
pub struct Pool {
    inner: deadpool_postgres::Pool,
    mode: PoolMode,
    /// Why the database was last said not to be ready ([`crate::ready`]),
    /// shared by the clones, so that a cause is logged once per change.
    pub(crate) not_ready: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("mode", &self.mode)
            .field("status", &self.inner.status())
            .finish()
    }
}

/// Why no connection could be had.
pub type PoolError = deadpool_postgres::PoolError;

/// A pool's connections at one moment ([`Pool::status`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStatus {
    /// The most it may hold (`DATABASE_POOL_SIZE`).
    pub max: usize,
    /// Connections open, idle or checked out.
    pub open: usize,
    /// Open connections in the pool, free to check out.
    pub idle: usize,
    /// Callers waiting for a connection: every one is checked out and no
    /// other may be opened.
    pub waiting: usize,
}

impl Pool {
    fn new(inner: deadpool_postgres::Pool, mode: PoolMode) -> Self {
        Self {
            inner,
            mode,
            not_ready: std::sync::Arc::default(),
        }
    }

    /// A connection: an idle one, or a new one when there is room; waits (up
    /// to the pool's wait) otherwise.
    pub async fn get(&self) -> Result<Client, PoolError> {
        Ok(Client {
            object: self.inner.get().await?,
            mode: self.mode,
        })
    }

    pub fn mode(&self) -> PoolMode {
        self.mode
    }

    /// Whether a connection can be had now without waiting: one is idle, or
    /// there is room to open one.
    pub fn has_room(&self) -> bool {
        let status = self.inner.status();
        status.available > 0 || status.size < status.max_size
    }

    /// Connections checked out now (each running, or about to run, a statement).
    pub fn busy(&self) -> usize {
        let status = self.inner.status();
        status.size.saturating_sub(status.available)
    }

    /// The pool's connections at this moment, for the metrics
    /// (`process::metrics`): read when scraped, never stored.
    pub fn status(&self) -> PoolStatus {
        let status = self.inner.status();
        PoolStatus {
            max: status.max_size,
            open: status.size,
            idle: status.available,
            waiting: status.waiting,
        }
    }

    /// Closes idle connections and refuses new checkouts.
    pub fn close(&self) {
        self.inner.close();
    }
}

/// A pooled connection, back in the pool when dropped. Statements run on it
/// through [`crate::Sql`] only, which is what keeps the mode's rules in one
/// place: there is deliberately no way to reach the raw client.
pub struct Client {
    object: deadpool_postgres::Client,
    mode: PoolMode,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("mode", &self.mode).finish()
    }
}

impl Client {
    pub fn mode(&self) -> PoolMode {
        self.mode
    }

    /// Takes the connection out of the pool and closes it. For a statement
    /// abandoned mid-flight (a deadline): the server then sees its client
    /// leave and rolls the statement back instead of committing it later.
    pub fn discard(self) {
        drop(deadpool_postgres::Object::take(self.object));
    }

    pub(crate) fn object(&self) -> &deadpool_postgres::ClientWrapper {
        &self.object
    }
}
