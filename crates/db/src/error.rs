//! What a database error means to a caller that must decide between
//! "try again later" (the database is away) and "this statement is wrong".

use tokio_postgres::error::SqlState;

/// Every code Postgres defines in class 08 (connection exception) and
/// class 57P (operator intervention that ends sessions), and
/// too_many_connections. Not 57014 (query_canceled): a cancelled statement
/// ran on a working connection.
const CONNECTIVITY: &[SqlState] = &[
    SqlState::CONNECTION_EXCEPTION,
    SqlState::CONNECTION_DOES_NOT_EXIST,
    SqlState::CONNECTION_FAILURE,
    SqlState::SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
    SqlState::SQLSERVER_REJECTED_ESTABLISHMENT_OF_SQLCONNECTION,
    SqlState::TRANSACTION_RESOLUTION_UNKNOWN,
    SqlState::PROTOCOL_VIOLATION,
    SqlState::ADMIN_SHUTDOWN,
    SqlState::CRASH_SHUTDOWN,
    SqlState::CANNOT_CONNECT_NOW,
    SqlState::DATABASE_DROPPED,
    SqlState::IDLE_SESSION_TIMEOUT,
    SqlState::TOO_MANY_CONNECTIONS,
];

/// True when an error means the database could not be reached or the
/// connection broke, as opposed to a problem with the statement itself.
/// An error without a code never came from the server: I/O, TLS, a timeout.
pub fn is_connectivity_error(err: &tokio_postgres::Error) -> bool {
    if err.is_closed() {
        return true;
    }
    match err.code() {
        Some(code) => CONNECTIVITY.contains(code),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_classes_08_and_57p_and_too_many_connections() {
        for code in CONNECTIVITY {
            let c = code.code();
            assert!(c.starts_with("08") || c.starts_with("57P") || c == "53300", "{c}");
        }
        assert!(!CONNECTIVITY.contains(&SqlState::QUERY_CANCELED));
    }
}
