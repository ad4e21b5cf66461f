//! Postgres clusters for tests, both run by `scripts/pg-cluster.sh`: the
//! shared throwaway one every test's database lives in ([`admin_url`]), and
//! [`PrivateCluster`]s, a test's own, to stop and start without disturbing
//! the tests running beside it, or to serve TLS.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::bin::script;
use crate::net::free_port;
use crate::url::url_with_dbname;

/// The admin URL of the Postgres the tests use: `DATABASE_URL` when set,
/// else the throwaway cluster of `scripts/pg-cluster.sh` (started if needed).
pub fn admin_url() -> String {
    if let Ok(url) = std::env::var("DATABASE_URL")
        && !url.trim().is_empty()
    {
        return url;
    }
    let out = script("pg-cluster.sh")
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

/// A cluster of the test's own, on a free port, in a temporary folder.
/// Stopped and removed on drop.
pub struct PrivateCluster {
    dir: PathBuf,
    port: u16,
    /// Server certificate and key, when it serves TLS.
    tls: Option<(PathBuf, PathBuf)>,
    /// The admin URL `start` printed (with the cluster's admin password).
    url: String,
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
        let mut cluster = Self {
            dir,
            port,
            tls,
            url: String::new(),
        };
        cluster.url = cluster.run("start")?.trim().to_owned();
        Ok(cluster)
    }

    /// Runs `scripts/pg-cluster.sh verb` on this cluster; its stdout.
    fn run(&self, verb: &str) -> anyhow::Result<String> {
        let mut command = script("pg-cluster.sh");
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
        String::from_utf8(out.stdout).context("pg-cluster.sh's output")
    }

    /// The admin URL (user `postgres`, with its password).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Fast shutdown: connections are terminated, as in an outage.
    pub fn stop(&self) -> anyhow::Result<()> {
        self.run("stop").map(drop)
    }

    pub fn resume(&self) -> anyhow::Result<()> {
        self.run("start").map(drop)
    }

    /// Creates `name` in this cluster and migrates it; returns its URL.
    pub async fn migrated_database(&self, name: &str) -> anyhow::Result<String> {
        migrated_database(&self.url(), name).await
    }
}

/// Creates database `name` through the admin URL `url`, makes its `public`
/// schema safe and migrates it; returns its URL (`url`'s hosts and query).
pub(crate) async fn migrated_database(url: &str, name: &str) -> anyhow::Result<String> {
    let admin = db::Database::parse(url)?;
    let client = admin.connect("testkit").await?;
    client.batch_execute(&format!("CREATE DATABASE {name}")).await?;
    crate::database::secure_public_schema(&admin.with_dbname(name)).await?;
    let mut c = admin.with_dbname(name).connect("testkit").await?;
    db::migrate(&mut c).await?;
    Ok(url_with_dbname(url, name))
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = self.run("stop");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
