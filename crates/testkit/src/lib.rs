//! Test support shared by every crate's integration tests and the end-to-end
//! tests. Real parts only: a real Postgres, real processes.
//!
//! # Layout
//! - [`TestDb`]: a fresh database per test, cloned from a template migrated
//!   once per migration set (creating one costs a file copy, not a migration).
//!   The test itself connects as the cluster's superuser; the services under
//!   test log in as members of their own roles ([`Role`], [`TestDb::url_as`]).
//! - [`PrivateCluster`]: a cluster of a test's own, to stop and start without
//!   disturbing the tests running beside it, or to serve TLS.
//! - [`PgBouncer`]: a transaction-mode pooler in front of a cluster.
//! - [`bin`]: the workspace's built binaries, for tests that run processes.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::Context as _;

/// The workspace root (this crate lives in `crates/testkit`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// The admin URL of the Postgres the tests use: `DATABASE_URL` when set,
/// else the throwaway cluster of `scripts/pg-cluster.sh` (started if needed).
pub fn admin_url() -> String {
    if let Ok(url) = std::env::var("DATABASE_URL")
        && !url.trim().is_empty()
    {
        return url;
    }
    let out = Command::new(workspace_root().join("scripts/pg-cluster.sh"))
        .arg("start")
        .output()
        .expect("running scripts/pg-cluster.sh");
    assert!(
        out.status.success(),
        "scripts/pg-cluster.sh start failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8 url")
        .trim()
        .to_owned()
}

/// `url` with its database name replaced.
pub fn url_with_dbname(url: &str, dbname: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[scheme_end..].find('/').map(|i| i + scheme_end);
    let mut out = match path_start {
        Some(i) => format!("{}/{dbname}", &base[..i]),
        None => format!("{base}/{dbname}"),
    };
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// `url` logging in as `user` with `password` instead of its own credentials.
pub fn url_with_user(url: &str, user: &str, password: &str) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let host = match rest[..authority_end].rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    format!("{}{user}:{password}@{host}", &url[..scheme_end])
}

/// `url` reaching `127.0.0.1:port` (a pooler, say) instead of its own host
/// and port; user, database and parameters unchanged.
pub fn url_with_port(url: &str, port: u16) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (userinfo, _) = match rest[..authority_end].rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..authority_end]),
        None => ("", &rest[..authority_end]),
    };
    format!(
        "{}{userinfo}127.0.0.1:{port}{}",
        &url[..scheme_end],
        &rest[authority_end..]
    )
}

/// The port a URL connects to (5432 when it names none).
pub fn port_of(url: &str) -> u16 {
    let config: tokio_postgres::Config = url.parse().expect("a postgres URL");
    config.get_ports().first().copied().unwrap_or(5432)
}

/// The services' group roles (`migrations/V2__roles.sql`), each with the
/// login user tests connect as. Roles are cluster-wide: the users are
/// created once per cluster, by whichever test process gets there first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `webhook_ingest`: what the ingest needs, nothing else.
    Ingest,
    /// `outbox_relay`: what the relay and its operator commands need.
    Relay,
    /// `outbox_monitor`: the KEDA trigger's count of due rows.
    Monitor,
}

/// The test users' password: irrelevant on the throwaway cluster (trust),
/// needed on a `DATABASE_URL` server that checks passwords.
pub const ROLE_PASSWORD: &str = "webhook_test";

impl Role {
    pub const ALL: [Role; 3] = [Role::Ingest, Role::Relay, Role::Monitor];

    /// The NOLOGIN group the migration grants to.
    pub fn group(self) -> &'static str {
        match self {
            Self::Ingest => "webhook_ingest",
            Self::Relay => "outbox_relay",
            Self::Monitor => "outbox_monitor",
        }
    }

    /// The LOGIN user tests connect as, a member of [`Role::group`].
    pub fn login(self) -> &'static str {
        match self {
            Self::Ingest => "webhook_test_ingest",
            Self::Relay => "webhook_test_relay",
            Self::Monitor => "webhook_test_monitor",
        }
    }

    /// Role-level settings, as deploy/sql/roles.sql recommends: what bounds
    /// statements when no startup options can (a transaction-mode pooler).
    fn settings(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::Ingest => &[
                ("statement_timeout", "5s"),
                ("client_connection_check_interval", "250ms"),
            ],
            Self::Relay => &[("statement_timeout", "30s"), ("synchronous_commit", "off")],
            Self::Monitor => &[
                ("statement_timeout", "5s"),
                ("default_transaction_read_only", "on"),
            ],
        }
    }

    /// Creates the group (when no migration did yet) and the login user,
    /// unless they exist. Safe against a concurrent run of itself: a
    /// creation that loses the race is a no-op.
    fn ensure_sql(self) -> String {
        let (group, login) = (self.group(), self.login());
        let settings: String = self
            .settings()
            .iter()
            .map(|(k, v)| format!("ALTER ROLE {login} SET {k} = '{v}';\n"))
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
            {settings}
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
    END IF;
END
$$;"
        )
    }
}

/// Clusters (host:port) whose login users this process has ensured.
static ROLES_ENSURED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Makes sure the login users of every [`Role`] exist in the cluster `client`
/// is connected to (`url` names it); once per cluster and process.
async fn ensure_login_roles(client: &tokio_postgres::Client, url: &str) -> anyhow::Result<()> {
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
    let client = TestDb::connect_url(url).await;
    ensure_login_roles(&client, url)
        .await
        .expect("creating the test users");
    url_with_user(url, role.login(), ROLE_PASSWORD)
}

/// One privilege a role holds on a table of the current schema, or on one
/// column of it (`column: Some(..)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub table: String,
    pub column: Option<String>,
    pub privilege: String,
}

impl Grant {
    fn target(&self) -> String {
        match &self.column {
            Some(column) => format!("{} ({column}) ON {}", self.privilege, self.table),
            None => format!("{} ON {}", self.privilege, self.table),
        }
    }

    pub fn revoke_sql(&self, role: &str) -> String {
        format!("REVOKE {} FROM {role}", self.target())
    }

    pub fn grant_sql(&self, role: &str) -> String {
        format!("GRANT {} TO {role}", self.target())
    }
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.target())
    }
}

/// Every privilege granted directly to `role` on the tables of the current
/// schema (table-level and column-level), as the catalog records them.
pub async fn grants_of(client: &tokio_postgres::Client, role: &str) -> Vec<Grant> {
    client
        .query(
            "SELECT c.relname::text, NULL::text, a.privilege_type
               FROM pg_class c, aclexplode(c.relacl) a
              WHERE a.grantee = $1::text::regrole AND c.relnamespace = current_schema()::regnamespace
             UNION ALL
             SELECT c.relname::text, att.attname::text, a.privilege_type
               FROM pg_class c JOIN pg_attribute att ON att.attrelid = c.oid, aclexplode(att.attacl) a
              WHERE a.grantee = $1::text::regrole AND c.relnamespace = current_schema()::regnamespace
              ORDER BY 1, 2, 3",
            &[&role],
        )
        .await
        .expect("reading the catalog's grants")
        .into_iter()
        .map(|r| Grant {
            table: r.get(0),
            column: r.get(1),
            privilege: r.get(2),
        })
        .collect()
}

/// SQLSTATE of insufficient_privilege ("permission denied", "must be owner").
pub const INSUFFICIENT_PRIVILEGE: &str = "42501";

/// Panics unless `sql` fails for lack of a privilege.
pub async fn assert_refused(client: &tokio_postgres::Client, sql: &str) {
    match client.batch_execute(sql).await {
        Ok(()) => panic!("allowed, but should be refused: {sql}"),
        Err(e) => assert_eq!(
            e.code().map(|c| c.code()),
            Some(INSUFFICIENT_PRIVILEGE),
            "{sql}: {e:?}"
        ),
    }
}

/// True when `result` failed for lack of a privilege.
pub fn is_refused<T>(result: &Result<T, tokio_postgres::Error>) -> bool {
    matches!(result, Err(e) if e.code().map(|c| c.code()) == Some(INSUFFICIENT_PRIVILEGE))
}

/// FNV-1a: a hash that stays the same across builds and toolchains.
fn fnv1a(bytes: &[u8], mut hash: u64) -> u64 {
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// The template's name changes with the migrations' content.
fn template_name() -> String {
    let dir = workspace_root().join("migrations");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("reading migrations/")
        .map(|e| e.expect("dir entry").path())
        .collect();
    files.sort();
    let mut hash = 0xcbf2_9ce4_8422_2325;
    for f in files {
        hash = fnv1a(f.file_name().unwrap().as_encoded_bytes(), hash);
        hash = fnv1a(&std::fs::read(&f).expect("reading a migration"), hash);
    }
    format!("webhook_tpl_{:012x}", hash & 0xffff_ffff_ffff)
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh, migrated database, dropped when the test ends.
pub struct TestDb {
    pub name: String,
    /// URL of this database as the cluster's superuser: for the test's own
    /// set-up and inspection. The services get [`TestDb::url_as`].
    pub url: String,
    admin_url: String,
}

impl TestDb {
    pub async fn new() -> Self {
        let admin_url = admin_url();
        let admin = db::Database::parse(&admin_url).expect("admin DATABASE_URL");
        let client = admin
            .connect("testkit")
            .await
            .expect("connecting to the test cluster");
        let template = template_name();
        ensure_template(&client, &admin, &template)
            .await
            .expect("creating the template database");
        ensure_login_roles(&client, &admin_url)
            .await
            .expect("creating the test users");
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!(
            "t_{}_{}_{:x}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            nanos
        );
        client
            .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {template}"))
            .await
            .expect("cloning the template");
        let url = url_with_dbname(&admin_url, &name);
        Self { name, url, admin_url }
    }

    /// A fresh database with nothing in it: not migrated.
    pub async fn empty() -> Self {
        let admin_url = admin_url();
        let admin = db::Database::parse(&admin_url).expect("admin DATABASE_URL");
        let client = admin
            .connect("testkit")
            .await
            .expect("connecting to the test cluster");
        let name = format!(
            "t_empty_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        ensure_login_roles(&client, &admin_url)
            .await
            .expect("creating the test users");
        client
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .await
            .unwrap();
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("creating a database");
        let url = url_with_dbname(&admin_url, &name);
        Self { name, url, admin_url }
    }

    /// A plain connection to any database URL.
    pub async fn connect_url(url: &str) -> tokio_postgres::Client {
        db::Database::parse(url)
            .expect("database url")
            .connect("test")
            .await
            .expect("connecting")
    }

    /// URL of this database for a service: logging in as `role`'s test user,
    /// with exactly the privileges the migrations grant that role.
    pub fn url_as(&self, role: Role) -> String {
        url_with_user(&self.url, role.login(), ROLE_PASSWORD)
    }

    pub fn database(&self) -> db::Database {
        db::Database::parse(&self.url).expect("test database url")
    }

    /// A plain connection to this database.
    pub async fn client(&self) -> tokio_postgres::Client {
        self.database()
            .connect("test")
            .await
            .expect("connecting to the test database")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop runs inside the test's runtime; do the async work on a thread
        // of its own. A failure leaves a database behind, nothing worse.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let admin = db::Database::parse(&admin_url).ok()?;
                let client = admin.connect("testkit").await.ok()?;
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
                    .ok()
            })
        })
        .join();
    }
}

async fn template_exists(
    client: &tokio_postgres::Client,
    template: &str,
) -> Result<bool, tokio_postgres::Error> {
    let row = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&template])
        .await?;
    Ok(row.is_some())
}

/// Creates the migrated template once, under an advisory lock so parallel
/// test processes wait for the first. It is built under a temporary name and
/// renamed, so a crash mid-way never leaves a half-migrated template.
async fn ensure_template(
    client: &tokio_postgres::Client,
    admin: &db::Database,
    template: &str,
) -> anyhow::Result<()> {
    if template_exists(client, template).await? {
        return Ok(());
    }
    client.execute("SELECT pg_advisory_lock(7261)", &[]).await?;
    let result = async {
        if template_exists(client, template).await? {
            return Ok(());
        }
        let building = format!("{template}_building");
        client
            .batch_execute(&format!("DROP DATABASE IF EXISTS {building} WITH (FORCE)"))
            .await?;
        client
            .batch_execute(&format!("CREATE DATABASE {building}"))
            .await?;
        {
            let mut c = admin.with_dbname(&building).connect("testkit").await?;
            db::migrate(&mut c).await.context("migrating the template")?;
        }
        // The migrating connection must be gone before the rename.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        client
            .batch_execute(&format!("ALTER DATABASE {building} RENAME TO {template}"))
            .await?;
        anyhow::Ok(())
    }
    .await;
    client.execute("SELECT pg_advisory_unlock(7261)", &[]).await?;
    result
}

/// A cluster of the test's own, on a free port, in a temporary folder.
/// Stopped and removed on drop.
pub struct PrivateCluster {
    dir: PathBuf,
    port: u16,
    /// Server certificate and key, when it serves TLS.
    tls: Option<(PathBuf, PathBuf)>,
}

impl PrivateCluster {
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(None)
    }

    /// A cluster serving TLS with this certificate and key (PEM files) as
    /// well as plain connections: clients choose with `sslmode`.
    pub fn start_with_tls(cert: &Path, key: &Path) -> anyhow::Result<Self> {
        Self::start_with(Some((cert.to_owned(), key.to_owned())))
    }

    fn start_with(tls: Option<(PathBuf, PathBuf)>) -> anyhow::Result<Self> {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("webhook-pg-private-{}-{port}", std::process::id()));
        let cluster = Self { dir, port, tls };
        cluster.run("start")?;
        Ok(cluster)
    }

    fn run(&self, verb: &str) -> anyhow::Result<()> {
        let mut command = Command::new(workspace_root().join("scripts/pg-cluster.sh"));
        command
            .arg(verb)
            .env("PG_CLUSTER_DIR", &self.dir)
            .env("PG_CLUSTER_PORT", self.port.to_string());
        if let Some((cert, key)) = &self.tls {
            command
                .env("PG_CLUSTER_SSL_CERT", cert)
                .env("PG_CLUSTER_SSL_KEY", key);
        }
        let out = command.output().context("running scripts/pg-cluster.sh")?;
        anyhow::ensure!(
            out.status.success(),
            "scripts/pg-cluster.sh {verb}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Fast shutdown: connections are terminated, as in an outage.
    pub fn stop(&self) -> anyhow::Result<()> {
        self.run("stop")
    }

    pub fn resume(&self) -> anyhow::Result<()> {
        self.run("start")
    }

    /// Creates `name` in this cluster and migrates it; returns its URL.
    pub async fn migrated_database(&self, name: &str) -> anyhow::Result<String> {
        let admin = db::Database::parse(&self.url())?;
        let client = admin.connect("testkit").await?;
        client.batch_execute(&format!("CREATE DATABASE {name}")).await?;
        let mut c = admin.with_dbname(name).connect("testkit").await?;
        db::migrate(&mut c).await?;
        Ok(url_with_dbname(&self.url(), name))
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = self.run("stop");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// PgBouncer 1.18 in transaction mode (`scripts/pgbouncer.sh`, which installs
/// it when missing) in front of the cluster on 127.0.0.1:`upstream_port`,
/// with few server connections per database and user, so that clients are
/// multiplexed for real. Stopped on drop.
pub struct PgBouncer {
    dir: PathBuf,
    port: u16,
}

impl PgBouncer {
    /// Lets the test users of every [`Role`] through (they must exist:
    /// [`TestDb::new`] or [`login_url`] made them).
    pub fn start(upstream_port: u16) -> anyhow::Result<Self> {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("webhook-pgbouncer-{}-{port}", std::process::id()));
        let users: Vec<&str> = Role::ALL.iter().map(|r| r.login()).collect();
        let bouncer = Self { dir, port };
        let out = Command::new(workspace_root().join("scripts/pgbouncer.sh"))
            .arg("start")
            .env("PGBOUNCER_DIR", &bouncer.dir)
            .env("PGBOUNCER_PORT", port.to_string())
            .env("PGBOUNCER_UPSTREAM_PORT", upstream_port.to_string())
            .env("PGBOUNCER_USERS", users.join(" "))
            .output()
            .context("running scripts/pgbouncer.sh")?;
        anyhow::ensure!(
            out.status.success(),
            "scripts/pgbouncer.sh start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(bouncer)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `url` (to the upstream) through the pooler: same user and database.
    pub fn url(&self, url: &str) -> String {
        url_with_port(url, self.port)
    }

    /// Its log: connections, and errors the clients saw.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = Command::new(workspace_root().join("scripts/pgbouncer.sh"))
            .arg("stop")
            .env("PGBOUNCER_DIR", &self.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An HTTP client for tests (rustls with the ring provider installed once).
pub fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// `sql`, a single count, read once.
pub async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0)
}

/// Polls `sql` (a count) every 50 ms until it reads `target`; panics with
/// the last reading after `timeout`.
pub async fn wait_for_count(
    client: &tokio_postgres::Client,
    sql: &str,
    target: i64,
    timeout: std::time::Duration,
) {
    let started = std::time::Instant::now();
    loop {
        let n = count(client, sql).await;
        if n == target {
            return;
        }
        assert!(
            started.elapsed() < timeout,
            "{sql}: {n}, expected {target} within {timeout:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A port free right now on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding an ephemeral port")
}

pub mod metrics;
pub mod process;

/// Paths of the workspace's built binaries (`cargo build` puts them beside
/// the test executables' folder).
pub mod bin {
    use std::path::PathBuf;

    pub fn path(name: &str) -> PathBuf {
        let exe = std::env::current_exe().expect("current test executable");
        // target/<profile>/deps/<test> -> target/<profile>/<name>
        let dir = exe
            .parent()
            .and_then(|d| d.parent())
            .expect("target profile folder");
        let path = dir.join(name);
        assert!(
            path.exists(),
            "{} is not built: run `cargo build --workspace --bins` first (make test does)",
            path.display()
        );
        path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dbname_replacement() {
        assert_eq!(
            url_with_dbname("postgres://u@h:1/postgres", "x"),
            "postgres://u@h:1/x"
        );
        assert_eq!(url_with_dbname("postgres://u@h:1", "x"), "postgres://u@h:1/x");
        assert_eq!(
            url_with_dbname("postgres://u:p@h/db?sslmode=disable", "x"),
            "postgres://u:p@h/x?sslmode=disable"
        );
    }

    #[test]
    fn user_and_port_replacement() {
        assert_eq!(
            url_with_user("postgres://postgres@127.0.0.1:5/db?sslmode=require", "a", "b"),
            "postgres://a:b@127.0.0.1:5/db?sslmode=require"
        );
        assert_eq!(url_with_user("postgres://h/db", "a", "b"), "postgres://a:b@h/db");
        assert_eq!(
            url_with_port("postgres://a:b@localhost:5/db?x=1", 7),
            "postgres://a:b@127.0.0.1:7/db?x=1"
        );
        assert_eq!(url_with_port("postgres://h", 7), "postgres://127.0.0.1:7");
        assert_eq!(port_of("postgres://a@h:6543/db"), 6543);
    }
}
