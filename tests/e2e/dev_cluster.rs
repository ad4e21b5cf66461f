//! The throwaway cluster of `scripts/pg-cluster.sh` itself, as on a
//! developer's machine: over TCP every user must give a password (the
//! admin's is random, kept in a file only the server's user may read, and
//! printed inside the URL `start` prints, nowhere else); a cluster an older
//! script left with `trust` is upgraded in place by the next `start`; and
//! the cluster's folder in /tmp is never followed through a symbolic link.
//!
//! Each test runs the script on a private folder and port of its own, and
//! stops that cluster at the end, failed or not. `PG_CLUSTER_SCRIPT` names
//! another script to run instead (an older version, to see these fail).

use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Output;

use harness::TempDir;
use tokio_postgres::{Config, NoTls};

use crate::harness;

/// A cluster of the script's at `dir` on `port`; stopped (and `dir`
/// removed, not followed if it is a link) on drop.
struct DevCluster {
    dir: PathBuf,
    port: u16,
}

impl DevCluster {
    fn at(dir: PathBuf) -> Self {
        Self {
            dir,
            port: testkit::free_port(),
        }
    }

    fn fresh(name: &str) -> Self {
        let port = testkit::free_port();
        let dir = std::env::temp_dir().join(format!("e2e-{name}-{}-{port}", std::process::id()));
        Self { dir, port }
    }

    fn run(&self, verb: &str) -> Output {
        let script = std::env::var_os("PG_CLUSTER_SCRIPT").map_or_else(
            || testkit::workspace_root().join("scripts/pg-cluster.sh"),
            PathBuf::from,
        );
        std::process::Command::new(&script)
            .arg(verb)
            .env("PG_CLUSTER_DIR", &self.dir)
            .env("PG_CLUSTER_PORT", self.port.to_string())
            .env_remove("PG_CLUSTER_SSL_CERT")
            .env_remove("PG_CLUSTER_SSL_KEY")
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()))
    }

    /// `start`, which must succeed; the URL it printed.
    fn start(&self) -> String {
        let out = self.run("start");
        assert!(
            out.status.success(),
            "pg-cluster.sh start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// `postgres` over TCP with this password (or none).
    fn as_postgres(&self, password: Option<&str>) -> Config {
        let mut config = Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname("postgres");
        if let Some(p) = password {
            config.password(p);
        }
        config
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        let _ = self.run("stop");
        if self.dir.is_symlink() {
            let _ = std::fs::remove_file(&self.dir);
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

async fn login(config: &Config) -> Result<(), tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    let task = tokio::spawn(connection);
    client.simple_query("SELECT 1").await?;
    drop(client);
    let _ = task.await;
    Ok(())
}

/// Logins without the password, and with a wrong one, are refused; the
/// printed URL's password is the one that works. Returns it.
async fn assert_only_the_password_logs_in(cluster: &DevCluster, url: &str) -> String {
    assert!(
        login(&cluster.as_postgres(None)).await.is_err(),
        "a TCP login as postgres without a password was accepted"
    );
    let wrong = login(&cluster.as_postgres(Some("wrong"))).await;
    let err = wrong.expect_err("a TCP login as postgres with a wrong password was accepted");
    assert_eq!(
        err.as_db_error().map(|e| e.code().code()),
        Some("28P01"),
        "refused for its password: {err}"
    );
    let printed: Config = url.parse().expect("start prints a postgres URL");
    let password = printed
        .get_password()
        .map(|p| String::from_utf8(p.to_vec()).unwrap())
        .expect("the URL start prints carries the admin password");
    assert!(password.len() >= 16, "a long random password");
    login(&printed).await.expect("the printed URL logs in");
    login(&cluster.as_postgres(Some(&password)))
        .await
        .expect("so does its password as postgres");
    password
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

#[tokio::test]
async fn the_dev_cluster_demands_a_password_over_tcp_and_keeps_it_in_a_private_file() {
    let cluster = DevCluster::fresh("dev-cluster");
    let out = cluster.run("start");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "pg-cluster.sh start: {stderr}");
    let url = String::from_utf8(out.stdout).unwrap().trim().to_owned();

    let password = assert_only_the_password_logs_in(&cluster, &url).await;
    assert!(!stderr.contains(&password), "start's messages show the password");
    let status = cluster.run("status");
    assert!(status.status.success(), "status of a running cluster");
    assert!(
        !String::from_utf8_lossy(&status.stdout).contains(&password),
        "status shows the password"
    );
    let url_out = cluster.run("url");
    assert_eq!(
        String::from_utf8_lossy(&url_out.stdout).trim(),
        url,
        "url prints the same URL"
    );

    // The password file: the server's user's only.
    let file = cluster.dir.join("admin.password");
    assert_eq!(mode(&file), 0o600, "{} is mode 0600", file.display());
    assert_eq!(
        std::fs::read_to_string(&file).unwrap().trim(),
        password,
        "the file holds the URL's password"
    );
    assert_eq!(
        mode(&cluster.dir),
        0o700,
        "the cluster's folder (and its socket) is private"
    );
    // A second start (as every test process runs) prints the same URL.
    assert_eq!(cluster.start(), url);
}

#[tokio::test]
async fn start_upgrades_a_trust_cluster_of_the_old_script_in_place() {
    let cluster = DevCluster::fresh("dev-cluster-upgrade");
    let url = cluster.start();
    // What the old script left: trust everywhere, no admin password, no
    // password file; the cluster running, holding a database of the developer's.
    let admin = testkit::TestDb::connect_url(&url).await;
    admin.batch_execute("CREATE DATABASE kept").await.unwrap();
    let hba = cluster.dir.join("data/pg_hba.conf");
    std::fs::write(
        &hba,
        "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n",
    )
    .unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    admin
        .batch_execute("ALTER ROLE postgres PASSWORD NULL")
        .await
        .unwrap();
    drop(admin);
    let _ = std::fs::remove_file(cluster.dir.join("admin.password"));
    login(&cluster.as_postgres(None))
        .await
        .expect("the old cluster trusts TCP logins");

    let upgraded = cluster.start();
    assert_only_the_password_logs_in(&cluster, &upgraded).await;
    let client = testkit::TestDb::connect_url(&upgraded).await;
    let kept = client
        .query_one("SELECT count(*) FROM pg_database WHERE datname = 'kept'", &[])
        .await
        .unwrap();
    assert_eq!(kept.get::<_, i64>(0), 1, "the same cluster, its databases kept");
    assert_eq!(mode(&cluster.dir.join("admin.password")), 0o600);
}

#[tokio::test]
async fn start_refuses_a_symlink_planted_at_the_clusters_path_and_writes_nothing_through_it() {
    // A folder the test owns, private, and links to it (and to a name in it
    // that does not exist yet) where the cluster's folder would be.
    let target =
        TempDir(std::env::temp_dir().join(format!("e2e-dev-cluster-target-{}", testkit::free_port())));
    std::fs::DirBuilder::new().mode(0o700).create(&target.0).unwrap();
    let uid = std::fs::metadata(&target.0).unwrap().uid();
    for (name, points_to) in [
        ("dev-cluster-link", target.0.clone()),
        ("dev-cluster-dangling", target.0.join("made-through-the-link")),
    ] {
        let cluster =
            DevCluster::at(std::env::temp_dir().join(format!("e2e-{name}-{}", testkit::free_port())));
        std::os::unix::fs::symlink(&points_to, &cluster.dir).unwrap();

        let out = cluster.run("start");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "start through a symlink at {} ({name}) succeeded: {stderr}",
            cluster.dir.display()
        );
        assert_eq!(stderr.lines().count(), 1, "one line says why: {stderr}");
        assert!(stderr.contains("symbolic link"), "{stderr}");
        let written: Vec<_> = std::fs::read_dir(&target.0)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(written.is_empty(), "written through the link: {written:?}");
        let meta = std::fs::metadata(&target.0).unwrap();
        assert_eq!(
            (meta.uid(), meta.permissions().mode() & 0o7777),
            (uid, 0o700),
            "the link's target is neither chowned nor chmodded"
        );
        assert!(cluster.dir.is_symlink(), "the link is left as it was");
    }
}
