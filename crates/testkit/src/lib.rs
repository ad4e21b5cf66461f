//! Test support shared by every crate's integration tests and the end-to-end
//! tests. Real parts only: a real Postgres, real processes.
//!
//! # Layout
//! - [`TestDb`]: a fresh database per test, cloned from a template migrated
//!   once per migration set (creating one costs a file copy, not a migration).
//! - [`PrivateCluster`]: a cluster of a test's own, to stop and start without
//!   disturbing the tests running beside it.
//! - [`bin`]: the workspace's built binaries, for tests that run processes.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
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
    /// URL of this database (for the services under test).
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
}

impl PrivateCluster {
    pub fn start() -> anyhow::Result<Self> {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("webhook-pg-private-{}-{port}", std::process::id()));
        let cluster = Self { dir, port };
        cluster.run("start")?;
        Ok(cluster)
    }

    fn run(&self, verb: &str) -> anyhow::Result<()> {
        let out = Command::new(workspace_root().join("scripts/pg-cluster.sh"))
            .arg(verb)
            .env("PG_CLUSTER_DIR", &self.dir)
            .env("PG_CLUSTER_PORT", self.port.to_string())
            .output()
            .context("running scripts/pg-cluster.sh")?;
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

/// An HTTP client for tests (rustls with the ring provider installed once).
pub fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// A port free right now on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding an ephemeral port")
}

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
}
