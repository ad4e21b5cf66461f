//! Every statement of both services goes through here: [`Sql`] is its text and
//! parameter types, [`Executor`] is what runs it, and the one decision this
//! module exists for is made in [`Client`]: how a statement reaches the server.
//!
//! | connection | [`PoolMode::Session`] | [`PoolMode::Transaction`] |
//! |---|---|---|
//! | pooled ([`Client`]) | named, prepared once per connection (`prepare_typed_cached`), then Bind/Execute | unnamed, Parse/Bind/Execute/Sync in one round trip (`query_typed`) |
//! | single (`tokio_postgres::Client`) | unnamed, one round trip | the same |
//!
//! Behind a transaction-mode pooler, a connection's consecutive transactions
//! may run on different server sessions, so a statement prepared in one is
//! unknown in the next: nothing may outlive a statement. An unnamed statement
//! sent in one message sequence cannot be split across server sessions, and
//! still costs one round trip. Parameter types travel with the text so the
//! server need not be asked for them first (which would be a second trip).
//! Single connections (operator commands, the pruner) run a few statements
//! once each: preparing them would cost a round trip for nothing, whatever
//! the mode.

use std::future::Future;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Error, Row};

use crate::mode::PoolMode;
use crate::pool::{Client, Pool, PoolError};

/// A statement: its text (kept in a `.sql` file beside the code that runs
/// it), the types of its parameters (`$1`, `$2`, ... in order) and the result
/// columns its callers read by name. [`check`] holds all three against a
/// migrated schema; the workspace's statements test runs it on every one.
#[derive(Debug)]
pub struct Sql {
    /// Where the text lives, for messages (`webhook-ingest/record_event.sql`).
    pub name: &'static str,
    pub text: &'static str,
    pub types: &'static [Type],
    pub columns: &'static [Column],
}

/// One result column: the name the caller reads it by, and its type.
#[derive(Debug)]
pub struct Column {
    pub name: &'static str,
    pub ty: Type,
}

/// Shorthand for a [`Column`] in a `const` list.
pub const fn col(name: &'static str, ty: Type) -> Column {
    Column { name, ty }
}

impl Sql {
    /// A statement that returns no rows (or whose rows nobody reads).
    pub const fn new(name: &'static str, text: &'static str, types: &'static [Type]) -> Self {
        Self {
            name,
            text,
            types,
            columns: &[],
        }
    }

    /// The same statement, declaring the columns its callers read.
    pub const fn returning(self, columns: &'static [Column]) -> Self {
        Self { columns, ..self }
    }

    pub async fn query(
        &self,
        on: &(impl Executor + ?Sized),
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        on.query(self, params).await
    }

    /// Exactly one row, or an error.
    pub async fn query_one(
        &self,
        on: &(impl Executor + ?Sized),
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error> {
        on.query_one(self, params).await
    }

    /// The number of rows the statement changed.
    pub async fn execute(
        &self,
        on: &(impl Executor + ?Sized),
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error> {
        on.execute(self, params).await
    }

    /// The highest `$n` in the text, so a test can hold it equal to the
    /// number of declared types (a mismatch is only found at run time).
    pub fn placeholders(&self) -> usize {
        let bytes = self.text.as_bytes();
        let mut highest = 0;
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'$' {
                let digits = bytes[i + 1..].iter().take_while(|b| b.is_ascii_digit()).count();
                if digits > 0 {
                    let n: usize = self.text[i + 1..i + 1 + digits].parse().unwrap_or(0);
                    highest = highest.max(n);
                }
                i += digits;
            }
            i += 1;
        }
        highest
    }

    fn typed<'a>(&self, params: &[&'a (dyn ToSql + Sync)]) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
        debug_assert_eq!(params.len(), self.types.len(), "parameters of {:?}", self.text);
        params.iter().copied().zip(self.types.iter().cloned()).collect()
    }
}

/// Prepares `sql` on `client` (a connection to a migrated database, as the
/// role that runs it in production) and compares what the server says with
/// what the code declares: the parameter types, and every result column by
/// name, type and position. The error names the statement and each mismatch.
pub async fn check(client: &tokio_postgres::Client, sql: &Sql) -> Result<(), String> {
    let statement = client
        .prepare_typed(sql.text, sql.types)
        .await
        .map_err(|e| format!("{}: does not prepare: {}", sql.name, db_error_text(&e)))?;
    let mut problems = Vec::new();
    if statement.params() != sql.types {
        problems.push(format!(
            "parameters: declared {:?}, the server infers {:?}",
            sql.types.iter().map(Type::name).collect::<Vec<_>>(),
            statement.params().iter().map(Type::name).collect::<Vec<_>>()
        ));
    }
    let actual: Vec<(&str, &Type)> = statement
        .columns()
        .iter()
        .map(|c| (c.name(), c.type_()))
        .collect();
    let declared: Vec<(&str, &Type)> = sql.columns.iter().map(|c| (c.name, &c.ty)).collect();
    if actual != declared {
        problems.push(format!(
            "columns: declared {:?}, the server returns {:?}",
            declared
                .iter()
                .map(|(n, t)| format!("{n} {}", t.name()))
                .collect::<Vec<_>>(),
            actual
                .iter()
                .map(|(n, t)| format!("{n} {}", t.name()))
                .collect::<Vec<_>>()
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {}", sql.name, problems.join("; ")))
    }
}

fn db_error_text(e: &Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// Something [`Sql`] runs on: a pooled [`Client`] (named or unnamed
/// statements by its pool's mode) or a single connection (unnamed). The statement is the caller's; this only says how it is sent.
pub trait Executor: Sync {
    fn query(
        &self,
        sql: &Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send;

    fn query_one(
        &self,
        sql: &Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Row, Error>> + Send;

    fn execute(
        &self,
        sql: &Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<u64, Error>> + Send;
}

impl Executor for Client {
    async fn query(&self, sql: &Sql, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, Error> {
        match self.mode() {
            PoolMode::Session => {
                let statement = self.object().prepare_typed_cached(sql.text, sql.types).await?;
                self.object().query(&statement, params).await
            }
            PoolMode::Transaction => self.object().query_typed(sql.text, &sql.typed(params)).await,
        }
    }

    async fn query_one(&self, sql: &Sql, params: &[&(dyn ToSql + Sync)]) -> Result<Row, Error> {
        match self.mode() {
            PoolMode::Session => {
                let statement = self.object().prepare_typed_cached(sql.text, sql.types).await?;
                self.object().query_one(&statement, params).await
            }
            PoolMode::Transaction => self.object().query_typed_one(sql.text, &sql.typed(params)).await,
        }
    }

    async fn execute(&self, sql: &Sql, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error> {
        match self.mode() {
            PoolMode::Session => {
                let statement = self.object().prepare_typed_cached(sql.text, sql.types).await?;
                self.object().execute(&statement, params).await
            }
            PoolMode::Transaction => self.object().execute_typed(sql.text, &sql.typed(params)).await,
        }
    }
}

impl Executor for tokio_postgres::Client {
    async fn query(&self, sql: &Sql, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, Error> {
        self.query_typed(sql.text, &sql.typed(params)).await
    }

    async fn query_one(&self, sql: &Sql, params: &[&(dyn ToSql + Sync)]) -> Result<Row, Error> {
        self.query_typed_one(sql.text, &sql.typed(params)).await
    }

    async fn execute(&self, sql: &Sql, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error> {
        self.execute_typed(sql.text, &sql.typed(params)).await
    }
}

impl Pool {
    /// Opens every connection the pool may hold and, in session mode,
    /// prepares `statements` on each; returns them all, checked out, for the
    /// caller to run what else warms a session (back in the pool when
    /// dropped). The first requests after a start then find the pool warm,
    /// instead of queueing behind logins, preparations and each session's
    /// first plans under load. An error (the server's connection limit,
    /// say) is returned only if no connection opened.
    pub async fn open_all(&self, statements: &'static [&'static Sql]) -> Result<Vec<Client>, PoolError> {
        let mut opening = tokio::task::JoinSet::new();
        for _ in 0..self.status().max {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_counted_by_the_highest_number() {
        assert_eq!(Sql::new("t", "SELECT 1", &[]).placeholders(), 0);
        assert_eq!(
            Sql::new("t", "SELECT $2::int8, $1, $10 || '$'", &[]).placeholders(),
            10
        );
        assert_eq!(Sql::new("t", "DO $$ BEGIN END $$", &[]).placeholders(), 0);
    }
}
