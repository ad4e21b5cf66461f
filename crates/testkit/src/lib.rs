//! Test support shared by every crate's integration tests and the end-to-end
//! tests. Real parts only: a real Postgres, real processes.
//!
//! Every item is reachable from the crate root (`testkit::TestDb`,
//! `testkit::free_port`, ...); the modules say where each one lives.
//!
//! # Layout
//! - [`database`]: [`TestDb`], a fresh database per test, cloned from a
//!   template migrated once per migration set.
//! - [`roles`]: [`Role`], the services' roles and the login users tests
//!   connect as ([`login_url`], [`TestDb::url_as`]).
//! - [`grants`]: what a role may do: the catalog's [`grants_of`] it, and
//!   [`assert_refused`] / [`is_refused`] for what the server refuses.
//! - [`cluster`]: the shared throwaway cluster ([`admin_url`]) and a
//!   [`PrivateCluster`] of a test's own, to stop and start or to serve TLS.
//! - [`ha`]: [`HaCluster`], a high-availability cluster of a test's own
//!   (Patroni, etcd, two nodes) whose primary it can kill.
//! - [`pgbouncer`]: [`PgBouncer`], a transaction-mode pooler in front of a cluster.
//! - [`plans`]: a statement's generic plan on a just-migrated database, as a
//!   service's session makes it, and the table reads in it that are not index probes.
//! - [`url`]: `postgres://` URLs as another user, database or port.
//! - [`net`]: a [`free_port`] and an [`http`] client.
//! - [`poll`]: [`count`] rows, and [`wait_for_count`] until another process
//!   has done its work.
//! - [`bin`]: the workspace root and its built binaries, for tests that run processes.
//! - [`process`]: a server process that announces itself on stdout.
//! - [`metrics`]: Prometheus text, parsed for assertions.
//! - [`webhook`]: a provider's delivery: an [`event`] body, signed, posted,
//!   and the order it is for.
#![forbid(unsafe_code)]
#![expect(
    clippy::unwrap_used,
    reason = "test support: a panic is how a test fails, with the call site in its message"
)]

pub mod bin;
pub mod cluster;
pub mod database;
pub mod grants;
pub mod ha;
pub mod metrics;
pub mod net;
pub mod pgbouncer;
pub mod plans;
pub mod poll;
pub mod process;
pub mod roles;
pub mod url;
pub mod webhook;

pub use bin::{run_cli, workspace_root};
pub use cluster::{PrivateCluster, admin_url};
pub use database::TestDb;
pub use grants::{Grant, assert_refused, grants_of, is_refused};
pub use ha::{HaCluster, Node as HaNode, Replication};
pub use net::{free_port, http};
pub use pgbouncer::PgBouncer;
pub use poll::{count, wait_for_count};
pub use roles::{ROLE_PASSWORD, Role, login_url};
pub use url::{port_of, url_with_dbname, url_with_port, url_with_user};
pub use webhook::{SECRET, event, insert_order, standard_headers};
