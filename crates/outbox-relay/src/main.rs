//! `outbox-relay`: run the worker (default), or an operator command
//! (`dead list`, `dead show`, `dead requeue`, `dead discard`, `stats`, `prune`, `audit`).
//!
//! # Layout
//! Parses the configuration and checks all of it the command needs (exit 2
//! with one line naming the variable on any error), then runs the command
//! with the start-up every process shares (`process::run_service` for the
//! worker: logs, traces, runtime, exit code; `process::run_command` for the
//! operator commands). The worker itself is the library: see `lib.rs`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use outbox_relay::config::{Cli, Command, DeadCommand, RelayConfig, Settings};
use outbox_relay::startup::Application;
use outbox_relay::{ops, storage};
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
    let retention_days = settings.retention_days;
    match cli.command.unwrap_or(Command::Run) {
        Command::Run => {
            let config = settings.relay().unwrap_or_else(|e| config_error(PROGRAM, &e));
            let listen_database = settings
                .listen_database()
                .unwrap_or_else(|e| config_error(PROGRAM, &e));
            let log = settings.log.clone();
            process::run_service(
                PROGRAM,
                &log,
                process::runtime::Threads::One,
                run(settings, database, listen_database, config),
            )
        }
        Command::Dead { command } => process::run_command(PROGRAM, async move {
            match command {
                DeadCommand::List {
                    kind,
                    limit,
                    after,
                    json,
                } => ops::dead_list(&database, &storage::DeadFilter { kind, limit, after }, json).await,
                DeadCommand::Show { id, json } => ops::dead_show(&database, id, json).await,
                DeadCommand::Requeue {
                    id,
                    all,
                    kind,
                    dry_run,
                    json,
                } => {
                    let filter = storage::RequeueFilter {
                        id: if all { None } else { id },
                        kind,
                        dry_run,
                    };
                    ops::dead_requeue(&database, &filter, json).await
                }
                DeadCommand::Discard { id, reason, json } => {
                    ops::dead_discard(&database, id, &reason, json).await
                }
            }
        }),
        Command::Stats { json } => {
            process::run_command(PROGRAM, async move { ops::stats(&database, json).await })
        }
        Command::Prune { json, progress_every } => process::run_command(PROGRAM, async move {
            ops::prune(&database, retention_days, progress_every, json).await
        }),
        Command::Audit { since, json } => {
            process::run_command(PROGRAM, async move { ops::audit(&database, since, json).await })
        }
    }
}

/// Relays until SIGTERM or Ctrl-C, then records the calls in flight.
async fn run(
    settings: Settings,
    database: db::Database,
    listen_database: Option<db::Database>,
    config: RelayConfig,
) -> anyhow::Result<()> {
    let app = Application::build(
        &settings.admin.admin_listen_addr.to_string(),
        &database,
        listen_database,
        settings.database_pool_size,
        config,
    )?;
    tracing::info!(admin_port = app.admin_port(), database = %database.describe(), "starting");
    app.run_until_stopped(process::shutdown::on_signal()).await
}
