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

/// An error and its causes, on one line (`a: b: c`): what a log line says
/// of an error, so that "db error" comes with what the server said.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        let cause = s.to_string();
        // deadpool's error repeats its source's text before pointing at it.
        if !text.ends_with(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        source = s.source();
    }
    text
}

/// What in the settings to check when no connection could be opened, read
/// from what failed: the server's refusal (its SQLSTATE), or no answer at all.
pub fn setting_to_check(err: &tokio_postgres::Error) -> &'static str {
    match err.code() {
        Some(c)
            if *c == SqlState::INVALID_PASSWORD || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
        {
            "the user and password in DATABASE_URL, and the role on the server"
        }
        Some(c) if *c == SqlState::INVALID_CATALOG_NAME => "the database name in DATABASE_URL",
        Some(c) if *c == SqlState::TOO_MANY_CONNECTIONS => {
            "the server's max_connections against DATABASE_POOL_SIZE times the replicas"
        }
        Some(c) if *c == SqlState::CANNOT_CONNECT_NOW => "the server: it is starting up or shutting down",
        Some(_) => "DATABASE_URL and the server's log",
        None => {
            "the host, the port and the TLS settings (sslmode, sslrootcert) in DATABASE_URL, and that the server runs"
        }
    }
}

/// What the operator should do about an error a command ended with, when a
/// database error in its chain says: a missing table is a schema never
/// migrated; a refused or failed connection points at a setting.
pub fn advice(error: &anyhow::Error) -> Option<String> {
    let err = error
        .chain()
        .find_map(|c| c.downcast_ref::<tokio_postgres::Error>())?;
    match err.code() {
        Some(c) if *c == SqlState::UNDEFINED_TABLE => {
            Some("the database is not migrated: run `webhook-ingest migrate`".to_owned())
        }
        Some(c)
            if c.code().starts_with("08")
                || c.code().starts_with("28")
                || *c == SqlState::INVALID_CATALOG_NAME
                || *c == SqlState::TOO_MANY_CONNECTIONS
                || *c == SqlState::CANNOT_CONNECT_NOW =>
        {
            Some(format!("check {}", setting_to_check(err)))
        }
        Some(_) => None,
        None if err.is_closed() => None,
        None => Some(format!("check {}", setting_to_check(err))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_chain_names_every_cause_once() {
        let cause = std::io::Error::other("the database system is starting up");
        let error = anyhow::Error::new(cause).context("db error");
        let error: &(dyn std::error::Error + 'static) = error.as_ref();
        assert_eq!(error_chain(error), "db error: the database system is starting up");
        let pool = crate::PoolError::Timeout(deadpool_postgres::TimeoutType::Create);
        assert_eq!(error_chain(&pool), "Timeout occurred while creating a new object");
    }

    #[test]
    fn the_list_is_classes_08_and_57p_and_too_many_connections() {
        for code in CONNECTIVITY {
            let c = code.code();
            assert!(c.starts_with("08") || c.starts_with("57P") || c == "53300", "{c}");
        }
        assert!(!CONNECTIVITY.contains(&SqlState::QUERY_CANCELED));
    }
}
