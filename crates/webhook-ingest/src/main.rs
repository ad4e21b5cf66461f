//! `webhook-ingest`: serve (default), `migrate`, `events list`, `events show`, `events replay`,
//! `events discard`.
//!
//! # Layout
//! Parses the configuration and checks all of it the command needs (exit 2
//! with one line naming the variable on any error), then runs the command
//! with the start-up every process shares (`process::run_service` for
//! serving: logs, traces, runtime, exit code; `process::run_command` for
//! the operator commands). The service itself is the library: see `lib.rs`.
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
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => {
            let verifier = settings.verifier().unwrap_or_else(|e| config_error(PROGRAM, &e));
            let log = settings.log.clone();
            process::run_service(
                PROGRAM,
                &log,
                process::runtime::Threads::PerCpu,
                serve(settings, database, verifier),
            )
        }
        Command::Migrate { json } => process::run_command(PROGRAM, migrate(database, json)),
        Command::Events {
            command:
                EventsCommand::List {
                    status,
                    id,
                    since,
                    after,
                    json,
                    limit,
                },
        } => process::run_command(PROGRAM, async move {
            let listing = webhook_ingest::events::Listing {
                status,
                id,
                since,
                after,
                limit,
            };
            webhook_ingest::events::list(&database, listing, json).await
        }),
        Command::Events {
            command: EventsCommand::Show { id, json },
        } => process::run_command(PROGRAM, async move {
            webhook_ingest::events::show(&database, &id, json).await
        }),
        Command::Events {
            command: EventsCommand::Replay { id, json },
        } => process::run_command(PROGRAM, async move {
            webhook_ingest::events::replay(&database, &id, json).await
        }),
        Command::Events {
            command: EventsCommand::Discard { id, reason, json },
        } => process::run_command(PROGRAM, async move {
            webhook_ingest::events::discard(&database, &id, &reason, json).await
        }),
    }
}

/// Serves webhooks until SIGTERM or Ctrl-C, then finishes those in flight.
async fn serve(
    settings: Settings,
    database: db::Database,
    verifier: signature::Verifier,
) -> anyhow::Result<()> {
    let app = Application::build(&settings, &database, verifier)?;
    tracing::info!(
        port = app.port(),
        admin_port = app.admin_port(),
        database = %database.describe(),
        scheme = settings.webhook_signature_scheme_name(),
        "webhook-ingest serving"
    );
    app.run_until_stopped(process::shutdown::on_signal()).await
}

/// Applies the embedded migrations; says on stderr what it did, or with
/// `--json` on stdout.
async fn migrate(database: db::Database, json: bool) -> anyhow::Result<()> {
    let mut client = database.connect("webhook-ingest-migrate").await?;
    let applied = db::migrate(&mut client).await?;
    if json {
        let version = db::migrate::expected_version();
        println!(
            "{}",
            serde_json::json!({ "applied": applied, "version": version })
        );
    } else if applied.is_empty() {
        eprintln!(
            "{PROGRAM}: schema already current (version {})",
            db::migrate::expected_version()
        );
    } else {
        eprintln!("{PROGRAM}: applied migrations {applied:?}");
    }
    Ok(())
}
