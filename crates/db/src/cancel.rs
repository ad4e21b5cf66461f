//! Cancelling a statement on the server, for a caller that gives up on it.
//!
//! Giving up does not do this by itself. Dropping a statement's future
//! leaves the connection open and the server runs the statement on; closing
//! the connection is noticed only at the next `client_connection_check_interval`
//! poll, or, without one, when the server writes the result: after the commit.

use tokio_postgres_rustls::MakeRustlsConnect;

use crate::connect::Database;
use crate::pool::Client;

/// Cancels a statement on the server: a cancel request (a new connection
/// carrying the session's key, which the server answers by interrupting that
/// session's statement), with the same TLS as the pool's connections, so
/// `sslmode=require` and `verify-full` hold for it too. PgBouncer forwards
/// cancel requests to the server session its client is linked to.
///
/// Made by [`crate::Database::canceller`].
#[derive(Clone)]
pub struct Canceller {
    tls: MakeRustlsConnect,
}

impl std::fmt::Debug for Canceller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Canceller").finish_non_exhaustive()
    }
}

impl Canceller {
    pub(crate) fn new(tls: MakeRustlsConnect) -> Self {
        Self { tls }
    }

    /// What [`Canceller::cancel`] needs to reach `client`'s server session:
    /// taken while the connection is at hand, before its statement is sent.
    pub fn session_of(&self, client: &Client) -> tokio_postgres::CancelToken {
        client.object().cancel_token()
    }

    /// Asks the server to cancel whatever `session` is running. `Ok` means
    /// the request was sent, not that a statement was cancelled: one that
    /// already finished is not affected, and the server does not answer.
    pub async fn cancel(&self, session: &tokio_postgres::CancelToken) -> Result<(), tokio_postgres::Error> {
        session.cancel_query(self.tls.clone()).await
    }
}

impl Database {
    /// Cancels statements on this database's connections; see [`Canceller`].
    pub fn canceller(&self) -> Canceller {
        Canceller::new(self.tls().clone())
    }
}
