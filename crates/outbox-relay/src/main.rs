//! `outbox-relay`: run the worker (default), or an operator command
//! (`dead list`, `dead requeue`, `stats`, `prune`).
//!
//! # Layout
//! Parses configuration (exit 2 with one line naming the variable on any
//! error), installs logging, then hands over to the library: see `lib.rs`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use outbox_relay::config::{Cli, Command, DeadCommand, Settings};
use outbox_relay::startup::Application;
use process::config_error;

/// mimalloc: the hot paths allocate small, short-lived buffers per request;
/// glibc's malloc showed as the largest single cost in profiles.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PROGRAM: &str = "outbox-relay";

fn main() -> ExitCode {
    let cli: Cli = process::parse_or_exit(PROGRAM);
    let settings = cli.settings;
    let database = settings.database().unwrap_or_else(|e| config_error(PROGRAM, &e));
    let command = cli.command.unwrap_or(Command::Run);
    // Telemetry lives outside the runtime: its exporter is flushed after the
    // runtime is gone, with a blocking client.
    let telemetry = match command {
        Command::Run => {
            let telemetry = process::traces::init(PROGRAM, settings.log_format)
                .unwrap_or_else(|e| config_error(PROGRAM, &e));
            Some(telemetry)
        }
        _ => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    let result = runtime.block_on(run(command, settings, database));
    drop(runtime);
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{PROGRAM}: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, settings: Settings, database: db::Database) -> anyhow::Result<()> {
    match command {
        Command::Run => {
            let config = settings.relay().unwrap_or_else(|e| config_error(PROGRAM, &e));
            let listen_database = settings
                .listen_database()
                .unwrap_or_else(|e| config_error(PROGRAM, &e));
            let app = Application::build(
                &settings.admin_listen_addr.to_string(),
                &database,
                listen_database,
                settings.database_pool_size,
                config,
            )?;
            tracing::info!(admin_port = app.admin_port(), database = %database.describe(), "starting");
            let shutdown = process::shutdown::on_signal();
            app.run_until_stopped(shutdown).await
        }
        Command::Dead {
            command: DeadCommand::List { json },
        } => outbox_relay::ops::dead_list(&database, json).await,
        Command::Dead {
            command: DeadCommand::Requeue { id, all },
        } => outbox_relay::ops::dead_requeue(&database, if all { None } else { id }).await,
        Command::Stats { json } => outbox_relay::ops::stats(&database, json).await,
        Command::Prune => outbox_relay::ops::prune(&database, settings.retention_days).await,
        Command::Audit {
            since,
            downstream_stats,
            json,
        } => outbox_relay::ops::audit(&database, since, downstream_stats.as_deref(), json).await,
    }
}
