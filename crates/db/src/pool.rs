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
use crate::sql::Sql;

/// How the connections of a pool reach Postgres (`DATABASE_POOL_MODE`).
///
/// Directly (or through a session-mode pooler), each client connection is a
/// server session of its own: a statement prepared once serves every later
/// request, and settings sent at connect (startup `options`) hold for good.
/// Through a transaction-mode pooler (PgBouncer `pool_mode = transaction`),
/// one connection's transactions may each run on another server session and
/// the pooler passes no startup `options`: nothing may outlive a statement,
/// and the settings must come from the login role (`ALTER ROLE ... SET`,
/// deploy/sql/roles.sql). (The variants' docs are `--help` text.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PoolMode {
    /// Directly or through a session-mode pooler: statements prepared once per connection, settings sent at connect
    #[default]
    Session,
    /// Through PgBouncer in transaction mode: unnamed statements, one round trip each; settings from the login role
    Transaction,
}

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
        Self { inner, mode }
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

    /// Opens every connection the pool may hold and, in session mode,
    /// prepares `statements` on each; returns them all, checked out, for the
    /// caller to run what else warms a session (back in the pool when
    /// dropped). The first requests after a start then find the pool warm,
    /// instead of queueing behind logins, preparations and each session's
    /// first plans under load. An error (the server's connection limit,
    /// say) is returned only if no connection opened.
    pub async fn open_all(&self, statements: &'static [&'static Sql]) -> Result<Vec<Client>, PoolError> {
        let mut opening = tokio::task::JoinSet::new();
        for _ in 0..self.inner.status().max_size {
            let pool = self.clone();
            // Each holds its connection until all are open, so that the
            // pool opens as many as it may hold rather than reuse one.
            opening.spawn(async move {
                let client = pool.get().await?;
                if client.mode() == PoolMode::Session {
                    for sql in statements {
                        client.object().prepare_typed_cached(sql.text, sql.types).await?;
                    }
                }
                Ok::<_, PoolError>(client)
            });
        }
        let mut warmed = Vec::new();
        let mut first_error = None;
        while let Some(done) = opening.join_next().await {
            match done {
                Ok(Ok(client)) => warmed.push(client),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                // A panic in a task, which prepares nothing else: nothing to keep.
                Err(_) => {}
            }
        }
        match first_error {
            Some(e) if warmed.is_empty() => Err(e),
            _ => Ok(warmed),
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
