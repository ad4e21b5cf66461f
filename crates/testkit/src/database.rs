//! A fresh database per test, cloned from a template migrated once per
//! migration set: creating one costs a file copy, not a migration. The test
//! itself connects as the cluster's superuser; the services under test log
//! in as members of their own roles ([`TestDb::url_as`]).

use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::Context as _;

use crate::bin::workspace_root;
use crate::cluster::admin_url;
use crate::roles::{ROLE_PASSWORD, Role, ensure_login_roles};
use crate::url::{url_with_dbname, url_with_user};

/// Advisory lock key under which one test process builds the template while
/// the others wait.
const TEMPLATE_LOCK: i64 = 7261;

/// Tells apart the databases one test process creates.
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
        secure_public_schema(&admin.with_dbname(&name))
            .await
            .expect("revoking CREATE on schema public from PUBLIC");
        Self { name, url, admin_url }
    }

    /// A plain connection to any database URL, resolving unqualified names
    /// the server's default way (`"$user", public`, whatever the role sets):
    /// tests write `FROM outbox`. The services pin theirs (`db::SEARCH_PATH`).
    pub async fn connect_url(url: &str) -> tokio_postgres::Client {
        db::Database::parse(url)
            .expect("database url")
            .connect_with_default_search_path("test")
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

    /// A plain connection to this database, as [`TestDb::connect_url`].
    pub async fn client(&self) -> tokio_postgres::Client {
        self.database()
            .connect_with_default_search_path("test")
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

/// What deploy/sql/roles.sql does, and `migrate` requires: PUBLIC may not
/// create in schema `public` of a new database. Already so since PostgreSQL
/// 15; before, a test server's `template1` still grants it.
pub(crate) async fn secure_public_schema(database: &db::Database) -> anyhow::Result<()> {
    database
        .connect("testkit")
        .await?
        .batch_execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        .await
        .context("REVOKE CREATE ON SCHEMA public FROM PUBLIC (as the schema's owner or a superuser)")
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
    client
        .execute("SELECT pg_advisory_lock($1)", &[&TEMPLATE_LOCK])
        .await?;
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
        secure_public_schema(&admin.with_dbname(&building)).await?;
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
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&TEMPLATE_LOCK])
        .await?;
    result
}
