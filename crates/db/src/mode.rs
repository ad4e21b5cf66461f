//! How a pool's connections reach Postgres: directly, or through a pooler
//! in transaction mode.

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
