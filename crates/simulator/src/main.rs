//! `simulator downstream`: the simulated fulfilment and email APIs.
//!
//! # Layout
//! Parses the command line (exit 2 with one line naming the variable on any
//! error), sends logs to stderr, starts the library's server, prints
//! `{"listening":"ADDR"}` as the only line on stdout (scripts wait for it and
//! read the port from it), and serves until SIGTERM or Ctrl-C.
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context as _;
use service::{LogFormat, config_error};
use simulator::cli::{Cli, Command};
use simulator::downstream;

const PROGRAM: &str = "simulator";

fn main() -> ExitCode {
    let cli: Cli = service::parse_or_exit(PROGRAM);
    // The server has its own worker threads; this runtime only waits.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{PROGRAM}: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Downstream(args) => {
            let config = args.config().unwrap_or_else(|e| config_error(PROGRAM, &e));
            init_logs(args.log_format);
            let running = downstream::spawn(config)
                .await
                .with_context(|| format!("listening on {}", args.listen))?;
            // Signal handlers first, so a SIGTERM right after the line is not lost.
            let shutdown = service::shutdown::on_signal();
            announce(running.addr())?;
            tracing::info!(
                addr = %running.addr(),
                workers = args.workers,
                idempotency = !args.no_idempotency,
                faults = %serde_json::to_string(&running.faults())?,
                "downstream serving"
            );
            running.run_until(shutdown.cancelled()).await?;
            tracing::info!("downstream stopped");
            Ok(())
        }
    }
}

/// The one line on stdout.
fn announce(addr: SocketAddr) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, r#"{{"listening":"{addr}"}}"#)?;
    stdout.flush()
}

/// Logs on stderr: stdout is the listening line alone.
fn init_logs(format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(service::logs::env_filter())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Pretty => builder.with_target(false).try_init(),
    };
}
