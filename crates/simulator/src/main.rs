//! `simulator downstream`: the simulated fulfilment and email APIs.
//! `simulator provider`: the simulated payment provider and load generator.
//! `simulator proxy`: the fault-injecting TCP proxy.
//! `simulator send`: one signed webhook, posted once, by hand.
//! `simulator audit`: exactly once in totals and the per-order rules after a run.
//!
//! # Layout
//! Parses the command line (exit 2 with one line naming the variable on any
//! error), then runs the subcommand:
//! - `downstream` sends logs to stderr, starts the library's server, prints
//!   `{"listening":"ADDR"}` as the only line on stdout (scripts wait for it
//!   and read the port from it), and serves until SIGTERM or Ctrl-C.
//! - `provider` runs the library's provider on a runtime of `--threads`
//!   threads, prints progress and the summary table on stderr and, with
//!   `--json`, the summary as the only line on stdout; exits 0 if every
//!   event was acknowledged (or refused for good, with `--allow-failures`),
//!   1 otherwise. SIGTERM or Ctrl-C stops it early, with a summary.
//! - `send` posts one signed event once and prints the status line and the
//!   answer on stdout; exit 0 on a 2xx, 1 otherwise.
//! - `audit` reads the downstream's stats and the database, prints the
//!   totals, the table of rules and the "exactly once" line on stdout (and
//!   the report as JSON to `--json-file`); exit 0 if every command had
//!   exactly one effect and every rule held, 1 on a violation or an error.
//! - `proxy` sends logs to stderr, binds the proxy and its control address,
//!   prints `{"listening":"ADDR","control":"ADDR"}` as the only line on
//!   stdout, and forwards until SIGTERM or Ctrl-C.
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context as _;
use process::{LogFormat, config_error};
use simulator::audit;
use simulator::cli::{AuditArgs, Cli, Command, DownstreamArgs, ProviderArgs, ProxyArgs, SendArgs};
use simulator::downstream::{self, DownstreamConfig};
use simulator::provider;
use simulator::proxy::{self, ProxyConfig};

const PROGRAM: &str = "simulator";

fn main() -> ExitCode {
    let cli: Cli = process::parse_or_exit(PROGRAM);
    match cli.command {
        Command::Downstream(args) => serve_downstream(args),
        Command::Provider(args) => provide(&args),
        Command::Proxy(args) => serve_proxy(args),
        Command::Send(args) => send(args),
        Command::Audit(args) => audit(&args),
    }
}

fn audit(args: &AuditArgs) -> ExitCode {
    let config = args.config().unwrap_or_else(|e| config_error(PROGRAM, &e));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    let report = match runtime.block_on(audit::run(&config)) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("{PROGRAM}: error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    println!("{report}");
    if let Some(path) = &args.json_file {
        let written = serde_json::to_vec(&report)
            .map_err(anyhow::Error::from)
            .and_then(|json| std::fs::write(path, json).map_err(anyhow::Error::from));
        if let Err(e) = written {
            eprintln!("{PROGRAM}: error: writing {}: {e:#}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn serve_downstream(args: DownstreamArgs) -> ExitCode {
    let config = args.config().unwrap_or_else(|e| config_error(PROGRAM, &e));
    // The server has its own worker threads; this runtime only waits.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    match runtime.block_on(run_downstream(args, config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{PROGRAM}: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_downstream(args: DownstreamArgs, config: DownstreamConfig) -> anyhow::Result<()> {
    init_logs(args.log_format);
    let running = downstream::spawn(config)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    // Signal handlers first, so a SIGTERM right after the line is not lost.
    let shutdown = process::shutdown::on_signal();
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

fn serve_proxy(args: ProxyArgs) -> ExitCode {
    let config = args.config().unwrap_or_else(|e| config_error(PROGRAM, &e));
    // One thread forwards: loopback test traffic needs no more, and the
    // control endpoints have their own.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    match runtime.block_on(run_proxy(args, config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{PROGRAM}: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_proxy(args: ProxyArgs, config: ProxyConfig) -> anyhow::Result<()> {
    init_logs(args.log_format);
    let running = proxy::spawn(config)
        .await
        .with_context(|| format!("listening on {} and {}", args.listen, args.control))?;
    let control = running.control_addr().context("the control address")?;
    // Signal handlers first, so a SIGTERM right after the line is not lost.
    let shutdown = process::shutdown::on_signal();
    announce_proxy(running.addr(), control)?;
    tracing::info!(
        addr = %running.addr(),
        %control,
        upstream = %args.upstream,
        faults = %serde_json::to_string(&running.faults())?,
        "proxy forwarding"
    );
    running.run_until(shutdown.cancelled()).await;
    tracing::info!("proxy stopped");
    Ok(())
}

fn send(args: SendArgs) -> ExitCode {
    let secret = args
        .signing
        .secret()
        .unwrap_or_else(|e| config_error(PROGRAM, &e));
    let event = provider::send::HandEvent {
        id: args
            .id
            .unwrap_or_else(|| format!("evt_hand_{:016x}", rand::random::<u64>())),
        event_type: args.event_type,
        payment_id: args.payment_id,
        amount: args.amount,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    match runtime.block_on(provider::send::send_once(
        &args.target,
        args.signing.scheme,
        secret,
        &event,
    )) {
        Ok(reply) => {
            let replayed = if reply.replayed {
                "  Idempotent-Replayed: true"
            } else {
                ""
            };
            println!("{} event {}{replayed}", reply.status, event.id);
            println!("{}", String::from_utf8_lossy(&reply.body));
            if (200..300).contains(&reply.status) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("{PROGRAM}: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn provide(args: &ProviderArgs) -> ExitCode {
    let config = args.config().unwrap_or_else(|e| config_error(PROGRAM, &e));
    // One thread by default: no cross-thread wake-ups, and the generator
    // leaves the rest of the machine to the ingest and Postgres it loads.
    let runtime = match args.threads {
        1 => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(usize::from(n))
            .enable_all()
            .build(),
    }
    .expect("building the tokio runtime");
    let ran = runtime.block_on(async {
        let stop = process::shutdown::on_signal();
        provider::run_until(config, !args.no_progress, stop).await
    });
    let summary = match ran {
        Ok(report) => report.summary,
        Err(e) => {
            eprintln!("{PROGRAM}: error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("{summary}");
    if args.json
        && let Err(e) = print_json(&summary)
    {
        eprintln!("{PROGRAM}: error: printing the summary: {e:#}");
        return ExitCode::FAILURE;
    }
    if summary.success(args.allow_failures) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The summary as the one line on stdout.
fn print_json(summary: &provider::Summary) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer(&mut stdout, summary)?;
    writeln!(stdout)?;
    stdout.flush()?;
    Ok(())
}

/// The one line on stdout.
fn announce(addr: SocketAddr) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, r#"{{"listening":"{addr}"}}"#)?;
    stdout.flush()
}

/// The proxy's one line on stdout: where clients connect, where faults are set.
fn announce_proxy(addr: SocketAddr, control: SocketAddr) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, r#"{{"listening":"{addr}","control":"{control}"}}"#)?;
    stdout.flush()
}

/// Logs on stderr: stdout is the listening line alone.
fn init_logs(format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(process::logs::env_filter())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Pretty => builder
            .with_target(false)
            .with_ansi(process::logs::colour(&std::io::stderr()))
            .try_init(),
    };
}
