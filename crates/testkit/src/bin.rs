//! Where the workspace is, and its built binaries (`cargo build` puts them
//! beside the test executables' folder), for tests that run processes.

use std::path::{Path, PathBuf};

/// The workspace root (this crate lives in `crates/testkit`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// The built binary `name` of the profile the test runs in; panics, saying
/// how to build it, when it is missing.
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

/// A command running `scripts/<name>` of the workspace.
pub(crate) fn script(name: &str) -> std::process::Command {
    std::process::Command::new(workspace_root().join("scripts").join(name))
}

/// Runs `program` (a built binary, e.g. `env!("CARGO_BIN_EXE_outbox-relay")`)
/// with `args` and `DATABASE_URL` set, as an operator would: (exited 0,
/// stdout, stderr).
pub fn run_cli(program: &str, database_url: &str, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(program)
        .args(args)
        .env("DATABASE_URL", database_url)
        .output()
        .unwrap_or_else(|e| panic!("{program} did not start: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
