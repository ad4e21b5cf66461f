//! `ops-console`: serves the operator's console until SIGTERM or Ctrl-C.
//! Checks every setting first (exit 2 with one line naming the variable).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use ops_console::config::Settings;
use ops_console::server::Application;
use process::config_error;

const PROGRAM: &str = "ops-console";

fn main() -> ExitCode {
    let settings: Settings = process::parse_or_exit(PROGRAM);
    let database = settings
        .database
        .parse_url()
        .unwrap_or_else(|e| config_error(PROGRAM, &e));
    let console = settings.console().unwrap_or_else(|e| config_error(PROGRAM, &e));
    let log = settings.log.clone();
    process::run_service(PROGRAM, &log, process::runtime::Threads::PerCpu, async move {
        let actions = console.actions;
        let app = Application::build(&settings, console, &database)?;
        tracing::info!(
            port = app.port(),
            admin_port = app.admin_port(),
            database = %database.describe(),
            actions = ?actions,
            "ops-console serving"
        );
        app.run_until_stopped(process::shutdown::on_signal()).await
    })
}
