//! A high-availability Postgres of a test's own, run by
//! `scripts/ha-cluster.sh`: Patroni with a one-member etcd and two Postgres
//! nodes on 127.0.0.1, for the tests that lose the primary and check what
//! survives. Its URLs name both nodes (libpq's multi-host form, with
//! `target_session_attrs=read-write`), so a client's next connection after a
//! failover reaches the new primary; [`crate::url`]'s helpers and
//! [`crate::login_url`] keep both hosts and the query.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::bin::script;
use crate::net::free_port;

/// How a commit reaches the standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// Patroni's `synchronous_mode`: a commit is acknowledged once the
    /// standby has it, and only that standby is promoted: a failover loses
    /// no acknowledged write.
    Sync,
    /// A commit is acknowledged once the primary has it; the standby is
    /// promoted however far behind: a failover loses the acknowledged
    /// writes it had not received.
    Async,
}

impl Replication {
    /// `HA_CLUSTER_REPLICATION`'s value.
    fn as_str(self) -> &'static str {
        match self {
            Self::Sync => "sync",
            Self::Async => "async",
        }
    }
}

/// A node running as the primary: its Patroni name (`node1`, `node2`), its
/// Postgres port on 127.0.0.1 and its postmaster's pid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub port: u16,
    pub postmaster_pid: i32,
}

/// The ports `scripts/ha-cluster.sh` takes from its base port: etcd's two,
/// two Postgres, two Patroni REST APIs.
const PORTS: u16 = 6;

/// Patroni, etcd and two Postgres nodes in a temporary folder, on a block
/// of free ports. Stopped and removed on drop (after printing its state and
/// logs to stderr when the test is failing).
pub struct HaCluster {
    dir: PathBuf,
    /// The base port (`HA_CLUSTER_PORT`).
    port: u16,
    replication: Replication,
    /// The admin URL `start` printed (both nodes, with the admin password).
    url: String,
}

impl HaCluster {
    /// Creates and starts a cluster; returns once a node is the primary and
    /// the other streams from it (its synchronous standby with
    /// [`Replication::Sync`]). About 10 s.
    pub fn start(replication: Replication) -> anyhow::Result<Self> {
        let port = free_port_block(PORTS);
        let dir = std::env::temp_dir().join(format!("webhook-ha-{}-{port}", std::process::id()));
        let mut cluster = Self {
            dir,
            port,
            replication,
            url: String::new(),
        };
        // On failure `cluster` is dropped here, which stops what started.
        cluster.url = cluster.run("start")?.trim().to_owned();
        Ok(cluster)
    }

    /// Switches the running cluster to `replication` and waits until it is
    /// in force.
    pub fn set_replication(&mut self, replication: Replication) -> anyhow::Result<()> {
        self.replication = replication;
        self.run("start").map(drop)
    }

    pub fn replication(&self) -> Replication {
        self.replication
    }

    /// Runs `scripts/ha-cluster.sh verb` on this cluster.
    fn output(&self, verb: &str) -> anyhow::Result<Output> {
        script("ha-cluster.sh")
            .arg(verb)
            .env("HA_CLUSTER_DIR", &self.dir)
            .env("HA_CLUSTER_PORT", self.port.to_string())
            .env("HA_CLUSTER_REPLICATION", self.replication.as_str())
            .output()
            .context("running scripts/ha-cluster.sh")
    }

    /// `scripts/ha-cluster.sh verb`, which must succeed; its stdout.
    fn run(&self, verb: &str) -> anyhow::Result<String> {
        let out = self.output(verb)?;
        anyhow::ensure!(
            out.status.success(),
            "scripts/ha-cluster.sh {verb}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).context("ha-cluster.sh's output")
    }

    /// The admin URL (user `postgres`, with its password), naming both
    /// nodes: `postgres://postgres:<pw>@127.0.0.1:<p1>,127.0.0.1:<p2>/postgres?target_session_attrs=read-write`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Creates `name` on the primary and migrates it; returns its URL (both
    /// nodes, read-write).
    pub async fn migrated_database(&self, name: &str) -> anyhow::Result<String> {
        crate::cluster::migrated_database(&self.url(), name).await
    }

    /// The node that holds Patroni's leader key and runs as the primary;
    /// an error while there is none (during a failover).
    pub fn primary(&self) -> anyhow::Result<Node> {
        let out = self.output("primary")?;
        anyhow::ensure!(
            out.status.success(),
            "no primary (scripts/ha-cluster.sh primary exited with {}: {})",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let line = String::from_utf8(out.stdout).context("ha-cluster.sh's output")?;
        let mut fields = line.split_whitespace();
        let (Some(name), Some(port), Some(pid), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            anyhow::bail!("scripts/ha-cluster.sh primary printed {line:?}, not `<name> <port> <pid>`");
        };
        Ok(Node {
            name: name.to_owned(),
            port: port.parse().context("the primary's port")?,
            postmaster_pid: pid.parse().context("the primary's postmaster pid")?,
        })
    }

    /// SIGKILL of the primary's postmaster (its backends then exit, and
    /// Patroni fails over); returns the node it was.
    pub fn kill_primary_postmaster(&self) -> anyhow::Result<Node> {
        let node = self.primary()?;
        let status = std::process::Command::new("kill")
            .args(["-KILL", &node.postmaster_pid.to_string()])
            .status()
            .context("running kill")?;
        anyhow::ensure!(
            status.success(),
            "kill -KILL {} ({}'s postmaster) failed: {status}",
            node.postmaster_pid,
            node.name
        );
        Ok(node)
    }

    /// The primary's node dying while its standby is `stall` behind, as a
    /// busy network or a slow standby leaves it: the primary's WAL senders
    /// are stopped (SIGSTOP) for `stall` while writes go on, then its
    /// postmaster and those senders get SIGKILL. With asynchronous
    /// replication, what committed meanwhile was acknowledged on the primary
    /// alone, and is not on the standby Patroni promotes; with synchronous
    /// replication, those commits waited for the standby and were never
    /// acknowledged. Returns the node it was.
    pub async fn kill_primary_with_standby_behind(&self, stall: Duration) -> anyhow::Result<Node> {
        let client = db::Database::parse(&self.url())?.connect("testkit").await?;
        let senders: Vec<i32> = client
            .query("SELECT pid FROM pg_stat_replication", &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        drop(client);
        anyhow::ensure!(
            !senders.is_empty(),
            "the primary has no WAL sender: no standby streams from it"
        );
        signal(&senders, "STOP")?;
        tokio::time::sleep(stall).await;
        let node = self.kill_primary_postmaster();
        signal(&senders, "KILL")?;
        node
    }

    /// Waits until a node other than `old` is the primary (promoted, taking
    /// writes); that node.
    pub fn wait_for_new_primary(&self, old: &str, timeout: Duration) -> anyhow::Result<Node> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.primary() {
                Ok(node) if node.name != old => return Ok(node),
                Ok(node) => format!("{} is still the primary", node.name),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "no new primary within {timeout:?} ({last})\n{}\n{}",
                    self.status(),
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `patronictl list` and the replication mode in force (no password).
    pub fn status(&self) -> String {
        match self.output("status") {
            Ok(out) => format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => format!("scripts/ha-cluster.sh status: {e:#}"),
        }
    }

    /// The last lines of etcd's log and of each node's (Patroni with its
    /// Postgres), for a failing test to show.
    pub fn logs(&self) -> String {
        ["etcd.log", "node1/patroni.log", "node2/patroni.log"]
            .iter()
            .map(|log| {
                let text = std::fs::read_to_string(self.dir.join(log)).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(40)..].join("\n");
                format!("--- {log} (last 40 lines)\n{tail}\n")
            })
            .collect()
    }
}

impl Drop for HaCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "HA cluster at its test's failure:\n{}\n{}",
                self.status(),
                self.logs()
            );
        }
        let _ = self.output("destroy");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The first of `len` consecutive ports free right now on 127.0.0.1.
fn free_port_block(len: u16) -> u16 {
    for _ in 0..1000 {
        let first = free_port();
        if first > u16::MAX - len {
            continue;
        }
        let bound: Result<Vec<TcpListener>, _> = (first..first + len)
            .map(|port| TcpListener::bind(("127.0.0.1", port)))
            .collect();
        if bound.is_ok() {
            return first;
        }
    }
    panic!("no {len} consecutive free ports on 127.0.0.1");
}

/// `kill -<signal>` of `pids`.
fn signal(pids: &[i32], signal: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .args(pids.iter().map(i32::to_string))
        .status()
        .context("running kill")?;
    anyhow::ensure!(status.success(), "kill -{signal} {pids:?} failed: {status}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::url::{port_of, url_with_dbname, url_with_user};

    const URL: &str =
        "postgres://postgres:pw@127.0.0.1:31002,127.0.0.1:31003/postgres?target_session_attrs=read-write";

    #[test]
    fn url_helpers_keep_both_hosts_and_the_query() {
        assert_eq!(
            url_with_dbname(URL, "history"),
            "postgres://postgres:pw@127.0.0.1:31002,127.0.0.1:31003/history?target_session_attrs=read-write"
        );
        assert_eq!(
            url_with_user(URL, "webhook_test_ingest", "x"),
            "postgres://webhook_test_ingest:x@127.0.0.1:31002,127.0.0.1:31003/postgres?target_session_attrs=read-write"
        );
        // What roles.rs keys the clusters it made its users in by.
        assert_eq!(
            url_with_dbname(&url_with_user(URL, "", ""), ""),
            "postgres://:@127.0.0.1:31002,127.0.0.1:31003/?target_session_attrs=read-write"
        );
        assert_eq!(port_of(URL), 31002);
    }

    #[test]
    fn the_services_parse_both_hosts_and_read_write() {
        let config: tokio_postgres::Config = url_with_dbname(URL, "history").parse().unwrap();
        assert_eq!(config.get_hosts().len(), 2);
        assert_eq!(config.get_ports(), [31002, 31003]);
        assert_eq!(config.get_dbname(), Some("history"));
        assert_eq!(
            config.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
        let database = db::Database::parse(&url_with_dbname(URL, "history")).unwrap();
        assert_eq!(database.describe(), "127.0.0.1:31002/history");
    }
}
