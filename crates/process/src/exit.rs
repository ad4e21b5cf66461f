//! Exit codes, in one place. Scripts and Kubernetes read them: a
//! configuration error is the operator's to fix (restarting will not help),
//! a failure at run time may be transient.

use std::process::ExitCode;

/// The process ran and failed (a database gone, a listener that could not be
/// bound, an operator command that failed). Also a `main` that returned `Err`.
pub const FAILURE: u8 = 1;

/// A setting is missing or invalid: one line on stderr names the variable.
/// The same code clap uses for a usage error.
pub const CONFIGURATION: u8 = 2;

/// `0` for `Ok`; for `Err`, `program: error: <cause chain>` on stderr, with
/// what to do when a database error says ([`db::advice`]: run the migration,
/// check a setting), and [`FAILURE`].
pub fn from_result(program: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match db::advice(&e) {
                Some(advice) => eprintln!("{program}: error: {e:#}; {advice}"),
                None => eprintln!("{program}: error: {e:#}"),
            }
            ExitCode::from(FAILURE)
        }
    }
}
