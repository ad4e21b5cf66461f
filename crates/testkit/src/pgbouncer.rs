//! A transaction-mode pooler in front of a cluster, for the tests that show
//! the services work behind one (`DATABASE_POOL_MODE=transaction`).

use std::path::PathBuf;

use anyhow::Context as _;

use crate::bin::script;
use crate::net::free_port;
use crate::roles::{ROLE_PASSWORD, Role};
use crate::url::url_with_port;

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
    /// [`crate::TestDb::new`] or [`crate::login_url`] made them), logging in
    /// to the cluster with their [`ROLE_PASSWORD`].
    pub fn start(upstream_port: u16) -> anyhow::Result<Self> {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("webhook-pgbouncer-{}-{port}", std::process::id()));
        let users: Vec<&str> = Role::ALL.iter().map(|r| r.login()).collect();
        let bouncer = Self { dir, port };
        let out = script("pgbouncer.sh")
            .arg("start")
            .env("PGBOUNCER_DIR", &bouncer.dir)
            .env("PGBOUNCER_PORT", port.to_string())
            .env("PGBOUNCER_UPSTREAM_PORT", upstream_port.to_string())
            .env("PGBOUNCER_USERS", users.join(" "))
            .env("PGBOUNCER_PASSWORD", ROLE_PASSWORD)
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
        let _ = script("pgbouncer.sh")
            .arg("stop")
            .env("PGBOUNCER_DIR", &self.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
