//! The services' roles, as tests log in with them: each group role of
//! `migrations/V2__roles.sql` gets a login user of its own, so a service
//! under test holds exactly the privileges the migrations grant it.
//!
//! Roles are cluster-wide: the users are created once per cluster, by
//! whichever test process gets there first.

use std::sync::Mutex;

use anyhow::Context as _;

use crate::url::{url_with_dbname, url_with_user};

/// The services' group roles, each with the login user tests connect as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `webhook_ingest`: what the ingest needs, nothing else.
    Ingest,
    /// `outbox_relay`: what the relay and its operator commands need.
    Relay,
    /// `outbox_monitor`: the KEDA trigger's count of due rows.
    Monitor,
    /// `ops_console`: what the operator's console reads and its three actions.
    Console,
}

/// The test users' password: the throwaway cluster, like any `DATABASE_URL`
/// server that checks passwords, demands it over TCP (and a pooler in front
/// logs in with it: [`crate::PgBouncer`]).
pub const ROLE_PASSWORD: &str = "webhook_test";

impl Role {
    pub const ALL: [Role; 4] = [Role::Ingest, Role::Relay, Role::Monitor, Role::Console];

    /// The NOLOGIN group the migration grants to.
    pub fn group(self) -> &'static str {
        match self {
            Self::Ingest => "webhook_ingest",
            Self::Relay => "outbox_relay",
            Self::Monitor => "outbox_monitor",
            Self::Console => "ops_console",
        }
    }

    /// The LOGIN user tests connect as, a member of [`Role::group`].
    pub fn login(self) -> &'static str {
        match self {
            Self::Ingest => "webhook_test_ingest",
            Self::Relay => "webhook_test_relay",
            Self::Monitor => "webhook_test_monitor",
            Self::Console => "webhook_test_console",
        }
    }

    /// Role-level settings, as deploy/sql/roles.sql recommends: what bounds
    /// statements, and pins the `search_path`, when no startup options can
    /// (a transaction-mode pooler).
    fn settings(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::Ingest => &[
                ("statement_timeout", "5s"),
                ("client_connection_check_interval", "250ms"),
                ("search_path", "pg_catalog"),
            ],
            Self::Relay => &[
                ("statement_timeout", "30s"),
                ("synchronous_commit", "off"),
                ("search_path", "pg_catalog"),
            ],
            Self::Monitor => &[
                ("statement_timeout", "5s"),
                ("default_transaction_read_only", "on"),
                ("search_path", "pg_catalog"),
            ],
            Self::Console => &[("statement_timeout", "10s"), ("search_path", "pg_catalog")],
        }
    }

    /// Creates the group (when no migration did yet) and the login user,
    /// unless they exist, and gives the user each of its settings it lacks
    /// (a user made by an older testkit misses the newer ones). Safe against
    /// a concurrent run of itself: a creation or a setting that loses the
    /// race is a no-op.
    fn ensure_sql(self) -> String {
        let (group, login) = (self.group(), self.login());
        let settings: String = self
            .settings()
            .iter()
            .map(|(k, v)| {
                format!(
                    "    IF NOT EXISTS (SELECT FROM pg_db_role_setting
                    WHERE setrole = '{login}'::regrole AND setdatabase = 0
                      AND '{k}={v}' = ANY (setconfig)) THEN
        BEGIN
            ALTER ROLE {login} SET {k} = '{v}';
        -- A concurrent run set it first (a new row, or an updated one).
        EXCEPTION WHEN unique_violation OR internal_error THEN NULL;
        END;
    END IF;
"
                )
            })
            .collect();
        format!(
            "DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{group}') THEN
        BEGIN
            CREATE ROLE {group} NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{login}') THEN
        BEGIN
            CREATE ROLE {login} LOGIN PASSWORD '{ROLE_PASSWORD}' IN ROLE {group};
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
    END IF;
{settings}END
$$;"
        )
    }
}

/// Clusters (host:port) whose login users this process has ensured.
static ROLES_ENSURED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Makes sure the login users of every [`Role`] exist in the cluster `client`
/// is connected to (`url` names it); once per cluster and process.
pub(crate) async fn ensure_login_roles(client: &tokio_postgres::Client, url: &str) -> anyhow::Result<()> {
    let cluster = url_with_dbname(&url_with_user(url, "", ""), "");
    if ROLES_ENSURED.lock().unwrap().contains(&cluster) {
        return Ok(());
    }
    for role in Role::ALL {
        client
            .batch_execute(&role.ensure_sql())
            .await
            .with_context(|| format!("creating the test user {}", role.login()))?;
    }
    ROLES_ENSURED.lock().unwrap().push(cluster);
    Ok(())
}

/// `url` (a superuser's, to any database) logging in as `role`'s test user
/// instead, which is created first if the cluster has none yet.
pub async fn login_url(url: &str, role: Role) -> String {
    let client = crate::TestDb::connect_url(url).await;
    ensure_login_roles(&client, url)
        .await
        .expect("creating the test users");
    url_with_user(url, role.login(), ROLE_PASSWORD)
}
