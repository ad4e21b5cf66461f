//! Client spans of the product's statements, by the OpenTelemetry semantic
//! conventions for database spans (the stable ones, `db.system.name` and
//! `db.query.summary`; their PostgreSQL page):
//! [`client_span!`](crate::client_span) makes one; [`failed`], [`timed_out`]
//! and [`returned`] say how it ended.
//!
//! | attribute | value |
//! |---|---|
//! | span name, `db.query.summary` | the statement's [`Summary`]: a `&'static str` written beside the code that runs it |
//! | `db.system.name` | `postgresql` |
//! | `db.namespace` | the database name of `DATABASE_URL` (the user's name when it names none, as the server takes it); no schema: every session's `search_path` is `pg_catalog` (see [`crate::SEARCH_PATH`]) and the statements name their tables `public.<table>` |
//! | `db.operation.name`, `db.collection.name` | only for a statement that is one operation on one table (`db.collection.name` also for several operations on one table) |
//! | `server.address`, `server.port` | the first host and port of `DATABASE_URL` (a pooler's, when the URL leads to one) |
//! | `db.response.returned_rows` | the rows a statement answered with, where its caller counts them |
//! | `db.response.status_code` | on failure, the SQLSTATE the server answered with |
//! | `error.type` | on failure, that SQLSTATE; without one, `connection_closed`, `timeout` (the caller's deadline passed first) or `_OTHER` |
//!
//! The span's kind is client and its status is error when the statement
//! failed. No statement text is recorded (`db.query.text`): the summary names
//! the statement, and copying kilobytes of text into every span is what this
//! hot path cannot afford.
//!
//! Cost: the span's name is static; its attributes are the fields of one
//! `info_span!` call site per statement, with values that are `&'static str`
//! or borrowed from a [`Server`] built once, so nothing is formatted per
//! statement.

use std::sync::Arc;

/// What a statement's client span says it does: its `db.query.summary`
/// (also the span's name), and its `db.operation.name` and
/// `db.collection.name` when it has one of each.
///
/// A summary lists each operation on a table, in the order the statement's
/// text names them, followed by the table as the text names it:
/// `SELECT public.outbox UPDATE public.outbox` (the conventions' "generating
/// a summary" rule; the selects of a CTE that read no table are left out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub text: &'static str,
    pub operation: Option<&'static str>,
    pub collection: Option<&'static str>,
}

impl Summary {
    /// One operation on one table: `text` is `"{operation} {collection}"`
    /// (checked at compile time where it is a `const`).
    pub const fn single(text: &'static str, operation: &'static str, collection: &'static str) -> Self {
        assert!(
            is_pair(text.as_bytes(), operation.as_bytes(), collection.as_bytes()),
            "a single operation's summary is its operation, a space and its table"
        );
        Self {
            text,
            operation: Some(operation),
            collection: Some(collection),
        }
    }

    /// Several operations, all on `collection`.
    pub const fn on(text: &'static str, collection: &'static str) -> Self {
        Self {
            text,
            operation: None,
            collection: Some(collection),
        }
    }

    /// Several operations on several tables: the summary alone.
    pub const fn of(text: &'static str) -> Self {
        Self {
            text,
            operation: None,
            collection: None,
        }
    }

    /// Whether every word of the summary occurs in `sql`'s text, so that a
    /// statement whose tables or operations change cannot keep a summary
    /// that no longer describes it (each service's statements test).
    pub fn describes(&self, sql: &crate::Sql) -> Result<(), String> {
        let missing: Vec<&str> = self
            .text
            .split(' ')
            .filter(|word| !sql.text.contains(word))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{}: summary `{}` names {missing:?}, which the statement does not",
                sql.name, self.text
            ))
        }
    }
}

const fn is_pair(text: &[u8], first: &[u8], second: &[u8]) -> bool {
    if text.len() != first.len() + 1 + second.len() || text[first.len()] != b' ' {
        return false;
    }
    let mut i = 0;
    while i < first.len() {
        if text[i] != first[i] {
            return false;
        }
        i += 1;
    }
    let mut j = 0;
    while j < second.len() {
        if text[first.len() + 1 + j] != second[j] {
            return false;
        }
        j += 1;
    }
    true
}

/// Where a pool's statements go, as their spans say it: `db.namespace`,
/// `server.address` and `server.port`. Built once per [`crate::Database`]
/// ([`crate::Database::span_server`]); cloning it shares the strings.
#[derive(Debug, Clone)]
pub struct Server {
    namespace: Arc<str>,
    address: Arc<str>,
    port: u16,
}

impl Server {
    pub(crate) fn new(namespace: &str, address: &str, port: u16) -> Self {
        Self {
            namespace: namespace.into(),
            address: address.into(),
            port,
        }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    /// An int attribute, as the conventions type it (an unsigned value
    /// would be exported as a string).
    pub fn port(&self) -> i64 {
        i64::from(self.port)
    }
}

/// A client span for one run of a statement described by `$summary` (a
/// `const` [`Summary`](crate::span::Summary): its text is the span's static
/// name), to `$server` (a [`Server`](crate::span::Server)), as a child of
/// `parent:` when given, else of the current span. Its target is the
/// caller's module, as any span written there would have.
///
/// ```ignore
/// const CLAIM: db::span::Summary = db::span::Summary::on("SELECT public.outbox UPDATE public.outbox", "public.outbox");
/// let span = db::client_span!(&server, CLAIM);
/// ```
#[macro_export]
macro_rules! client_span {
    (@span [$($parent:tt)*] $server:expr, $summary:expr) => {
        $crate::__tracing::info_span!(
            $($parent)*
            $summary.text,
            otel.kind = "client",
            otel.status_code = $crate::__tracing::field::Empty,
            db.system.name = "postgresql",
            db.namespace = $server.namespace(),
            db.query.summary = $summary.text,
            db.operation.name = $summary.operation,
            db.collection.name = $summary.collection,
            db.operation.batch.size = $crate::__tracing::field::Empty,
            db.response.returned_rows = $crate::__tracing::field::Empty,
            db.response.status_code = $crate::__tracing::field::Empty,
            error.type = $crate::__tracing::field::Empty,
            server.address = $server.address(),
            server.port = $server.port(),
        )
    };
    (parent: $parent:expr, $server:expr, $summary:expr) => {
        $crate::client_span!(@span [parent: $parent,] $server, $summary)
    };
    ($server:expr, $summary:expr) => {
        $crate::client_span!(@span [] $server, $summary)
    };
}

/// The statement failed with `error`: the span's status is error, with the
/// SQLSTATE as `db.response.status_code` and `error.type` (a failure with no
/// SQLSTATE never reached the server's answer: `connection_closed` or
/// `_OTHER`).
pub fn failed(span: &tracing::Span, error: &tokio_postgres::Error) {
    span.record("otel.status_code", "ERROR");
    match error.code() {
        Some(code) => {
            span.record("db.response.status_code", code.code());
            span.record("error.type", code.code());
        }
        None if error.is_closed() => {
            span.record("error.type", "connection_closed");
        }
        None => {
            span.record("error.type", "_OTHER");
        }
    }
}

/// The caller stopped waiting for the statement (its deadline passed): the
/// span's status is error, `error.type` is `timeout`.
pub fn timed_out(span: &tracing::Span) {
    span.record("otel.status_code", "ERROR");
    span.record("error.type", "timeout");
}

/// The statement answered with `rows` rows (`db.response.returned_rows`).
pub fn returned(span: &tracing::Span, rows: usize) {
    span.record(
        "db.response.returned_rows",
        i64::try_from(rows).unwrap_or(i64::MAX),
    );
}

impl crate::connect::Database {
    /// Where the statements of pools made from this database go, as their
    /// client spans say it ([`crate::span`]): the database (the user's name
    /// when the URL names none, as the server takes it), the first host and
    /// its port.
    pub fn span_server(&self) -> Server {
        let (host, port) = self.host_and_port();
        let database = self
            .config
            .get_dbname()
            .or(self.config.get_user())
            .unwrap_or_default();
        Server::new(database, &host, port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_summary_is_its_operation_and_its_table() {
        assert!(is_pair(b"SELECT public.outbox", b"SELECT", b"public.outbox"));
        assert!(!is_pair(b"SELECT public.outbox", b"UPDATE", b"public.outbox"));
        assert!(!is_pair(b"SELECT public.outboxes", b"SELECT", b"public.outbox"));
        assert!(!is_pair(b"SELECTpublic.outbox", b"SELECT", b"public.outbox"));
        let s = Summary::single("UPDATE public.outbox", "UPDATE", "public.outbox");
        assert_eq!(
            (s.operation, s.collection),
            (Some("UPDATE"), Some("public.outbox"))
        );
    }

    #[test]
    fn a_summary_must_name_only_what_its_statement_does() {
        const SQL: crate::Sql = crate::Sql::new(
            "t.sql",
            "UPDATE public.outbox SET x = 1 FROM (SELECT id FROM public.outbox) AS due",
            &[],
        );
        assert!(
            Summary::on("SELECT public.outbox UPDATE public.outbox", "public.outbox")
                .describes(&SQL)
                .is_ok()
        );
        let wrong = Summary::single("DELETE public.outbox", "DELETE", "public.outbox").describes(&SQL);
        assert!(wrong.is_err_and(|e| e.contains("[\"DELETE\"]")));
    }
}
