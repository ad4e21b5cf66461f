//! The simulated payment provider, and the project's load generator: it
//! makes payment events and delivers them to the ingest at least once, as a
//! real provider does.
//!
//! Each delivery attempt is signed afresh (the scheme's headers, a new
//! timestamp, the event's constant `webhook-id`), posted, and retried with
//! capped exponential backoff and full jitter until a 2xx (see [`delivery`]
//! for what each answer means). On top of that the provider misbehaves on
//! purpose, at configurable rates: it delivers an event a second time on its
//! own (some of those duplicates "late", after the rest of the run), and it
//! fires bursts of the same event at once. The event mix covers every path of
//! the ingest: payments, refunds of paid orders, unknown types, payments no
//! order matches.
//!
//! Load comes in two shapes ([`Load`]): a closed loop of N senders (what the
//! ingest sustains) or an open loop at a fixed rate (the latency a real
//! provider sees at a given load). Every attempt's latency goes into an
//! HdrHistogram; the [`Summary`] has the counts, the percentiles and the
//! ingest's answers, and [`AckRecord`]s say per event whether it was
//! acknowledged, so a test can check that the database holds exactly the
//! effects of the acknowledged events.
//!
//! The provider stands for an outside party: it knows the wire contract (the
//! JSON, the headers, the statuses) and nothing of the `domain` crate.
//!
//! Tests and benches run it in process with [`run`]; scripts run
//! `simulator provider`, which prints progress and the summary table on
//! stderr, the summary as one JSON line on stdout with `--json`, and exits
//! 0 only if every event was acknowledged.
//!
//! # Efficiency
//! The generator shares a 2-core machine with the ingest and Postgres
//! during `make bench`, so it does little per attempt: one `reqwest` client
//! and its keep-alive pool for the whole run, each secret's HMAC key state
//! computed once, each event's body built once and shared by its deliveries
//! (`Bytes`), counters in atomics, no logging per request, and the 2xx body
//! parsed (without copying) only until the event's first acknowledgement.
//!
//! # Layout
//! - [`config`]: [`ProviderConfig`] and its parts, with the defaults.
//! - `plan`: what event `n` is: kind, order, ids, body, duplicate, burst.
//! - [`delivery`]: one signed attempt, one delivery's retries, the backoff.
//! - `driver`: closed and open loop, the late phase, settling events.
//! - [`stats`]: live counters and histograms, the progress line.
//! - [`report`]: [`Summary`] and [`AckRecord`], the JSON shapes and the table.
//! - [`send`]: one event, signed and posted once, by hand (`simulator send`).

pub mod config;
pub mod delivery;
mod driver;
mod plan;
pub mod report;
pub mod send;
pub mod stats;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub use config::{Bursts, DelayRange, Duplicates, Load, Mix, ProviderConfig, RetryPolicy, WEBHOOK_PATH};
pub use report::{AckRecord, LatencyMs, Report, Summary};
pub use signature::{Scheme, Secret};

/// Runs the provider until every event generated is settled; prints a
/// progress line on stderr every second if `progress`. Must be called
/// within a Tokio runtime (any flavour; a current-thread one is the
/// cheapest per request).
pub async fn run(config: ProviderConfig, progress: bool) -> anyhow::Result<Report> {
    run_until(config, progress, CancellationToken::new()).await
}

/// [`run`], stopped early when `stop` is cancelled: no new event starts, no
/// delivery is retried, attempts in flight finish, and the report covers
/// what happened (events not acknowledged by then count as failed).
pub async fn run_until(
    config: ProviderConfig,
    progress: bool,
    stop: CancellationToken,
) -> anyhow::Result<Report> {
    config.validate().map_err(anyhow::Error::msg)?;
    let seed = config.seed.unwrap_or_else(rand::random);
    let run_id = config.run_id.clone();
    let run = Arc::new(driver::Run::new(&config, seed, stop)?);
    let mut report = run.run(progress).await?;
    report.summary.run_id = run_id;
    report.summary.seed = seed;
    Ok(report)
}
