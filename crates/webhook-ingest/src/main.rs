//! `webhook-ingest`: serve (default), `migrate`, `events list`.
//!
//! # Layout
//! Parses configuration (exit 2 with one line naming the variable on any
//! error), installs logging, then hands over to the library: see `lib.rs`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use process::config_error;
use webhook_ingest::config::{Cli, Command, EventsCommand, Settings};
use webhook_ingest::startup::Application;

/// mimalloc: the hot paths allocate small, short-lived buffers per request;
/// glibc's malloc showed as the largest single cost in profiles.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PROGRAM: &str = "webhook-ingest";

fn main() -> ExitCode {
    let cli: Cli = process::parse_or_exit(PROGRAM);
    let settings = cli.settings;
    let database = settings.database().unwrap_or_else(|e| config_error(PROGRAM, &e));
    let command = cli.command.unwrap_or(Command::Serve);
    // Telemetry lives outside the runtime: its exporter is flushed after the
    // runtime is gone, with a blocking client.
    let telemetry = match command {
        Command::Serve => {
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
        Command::Serve => {
            let verifier = settings.verifier().unwrap_or_else(|e| config_error(PROGRAM, &e));
            let app = Application::build(&settings, &database, verifier)?;
            tracing::info!(
                port = app.port(),
                admin_port = app.admin_port(),
                database = %database.describe(),
                scheme = settings.webhook_signature_scheme_name(),
                "webhook-ingest serving"
            );
            let shutdown = process::shutdown::on_signal();
            app.run_until_stopped(shutdown).await
        }
        Command::Migrate => {
            let mut client = database.connect("webhook-ingest-migrate").await?;
            let applied = db::migrate(&mut client).await?;
            if applied.is_empty() {
                eprintln!(
                    "{PROGRAM}: schema already current (version {})",
                    db::migrate::expected_version()
                );
            } else {
                eprintln!("{PROGRAM}: applied migrations {applied:?}");
            }
            Ok(())
        }
        Command::Events {
            command: EventsCommand::List { status, json, limit },
        } => webhook_ingest::events::list(&database, status.as_deref(), json, limit).await,
    }
}
