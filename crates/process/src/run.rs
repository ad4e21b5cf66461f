//! One start-up for every binary: configuration is checked in full before
//! anything starts (a bad setting exits [`exit::CONFIGURATION`] with one line,
//! see [`crate::config`]); then the work runs on the [`runtime`] and its
//! result becomes the exit code ([`exit::from_result`]).
//!
//! A `main` reads: parse, build the settings, then [`run_service`] for the
//! long-running command (logs and traces on) or [`run_command`] for an
//! operator command (its output is its answer; no log lines).

use std::future::Future;
use std::process::ExitCode;

use anyhow::Context as _;

use crate::args::LogArgs;
use crate::runtime::{self, Threads};
use crate::{config_error, exit, logs, traces};

/// Runs `work` on `threads` with logs and traces installed for `program`
/// (its OTLP `service.name`), flushing the spans once it returned.
pub fn run_service<F>(program: &'static str, log: &LogArgs, threads: Threads, work: F) -> ExitCode
where
    F: Future<Output = anyhow::Result<()>>,
{
    // Telemetry lives outside the runtime: its exporter is flushed after the
    // runtime is gone, with a blocking client.
    let telemetry = traces::init(program, log.log_format).unwrap_or_else(|e| config_error(program, &e));
    // The log lines still held are written last, even if `work` panics.
    let _flush = logs::FlushOnDrop;
    let result = block_on(work, threads, true);
    telemetry.shutdown();
    exit::from_result(program, result)
}

/// Runs an operator command: no logging installed, its output is its own.
pub fn run_command<F>(program: &'static str, work: F) -> ExitCode
where
    F: Future<Output = anyhow::Result<()>>,
{
    exit::from_result(program, block_on(work, Threads::PerCpu, false))
}

fn block_on<F>(work: F, threads: Threads, announce: bool) -> anyhow::Result<()>
where
    F: Future<Output = anyhow::Result<()>>,
{
    let (runtime, count) = runtime::build(threads).context("building the tokio runtime")?;
    if announce {
        tracing::info!(threads = count, "runtime started");
    }
    let result = runtime.block_on(work);
    // Tasks still running (a spawned listener, a gauge refresher) stop here,
    // before telemetry is flushed.
    drop(runtime);
    result
}
