//! `simulator provider`: targets, load shape, event mix, duplicates and
//! bursts, timeouts and retries, what to write and print.

use std::path::PathBuf;
use std::time::Duration;

use reqwest::Url;

use super::{SigningArgs, parse_positive, parse_rate};
use crate::provider::{
    Bursts, DelayRange, Duplicates, Load, Mix, ProviderConfig, RetryPolicy, config::default_run_id,
};

#[cfg(test)]
mod tests;

#[derive(Debug, Clone, clap::Args)]
pub struct ProviderArgs {
    /// Ingest URL(s), comma-separated; a delivery's retries go to the next
    /// one in turn. A bare base URL gets /webhooks/payments appended.
    #[arg(
        long,
        env = "PROVIDER_TARGET",
        value_name = "PROVIDER_TARGET",
        required = true,
        value_delimiter = ','
    )]
    pub target: Vec<Url>,

    #[command(flatten)]
    pub signing: SigningArgs,

    /// Closed loop: this many senders, each sending its next event once the
    /// previous one is acknowledged or given up.
    #[arg(long, env = "PROVIDER_CONCURRENCY", value_name = "PROVIDER_CONCURRENCY", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub concurrency: u32,

    /// Open loop instead: this many events per second on a schedule,
    /// whatever the answers (latency is measured from the schedule).
    #[arg(long, env = "PROVIDER_RATE", value_name = "PROVIDER_RATE", value_parser = parse_positive)]
    pub rate: Option<f64>,

    /// Events to generate (with --duration-secs: whichever ends first).
    #[arg(long, env = "PROVIDER_EVENTS", value_name = "PROVIDER_EVENTS",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub events: Option<u64>,

    /// Stop generating after this many seconds (fractions allowed); events
    /// started are still delivered.
    #[arg(long, env = "PROVIDER_DURATION_SECS", value_name = "PROVIDER_DURATION_SECS",
          value_parser = parse_positive)]
    pub duration_secs: Option<f64>,

    /// Prefix of event ids (`evt_<run-id>_<n>`); default: the Unix time now.
    #[arg(long, env = "PROVIDER_RUN_ID", value_name = "PROVIDER_RUN_ID")]
    pub run_id: Option<String>,

    /// Orders pay_1 .. pay_N exist; payment event n pays order n (wrapping).
    #[arg(long, env = "PROVIDER_ORDERS", value_name = "PROVIDER_ORDERS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub orders: u64,

    /// The first of those orders instead of pay_1: event n pays order
    /// FIRST + n - 1 (wrapping), so runs side by side pay orders apart.
    #[arg(long, env = "PROVIDER_FIRST_ORDER", value_name = "PROVIDER_FIRST_ORDER", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub first_order: u64,

    /// Share of events that refund an order already paid in this run.
    #[arg(long, env = "PROVIDER_REFUND_RATE", value_name = "PROVIDER_REFUND_RATE",
          default_value_t = 0.0, value_parser = parse_rate)]
    pub refund_rate: f64,

    /// Share of events of a type the ingest ignores (customer.updated).
    #[arg(long, env = "PROVIDER_UNKNOWN_RATE", value_name = "PROVIDER_UNKNOWN_RATE",
          default_value_t = 0.0, value_parser = parse_rate)]
    pub unknown_rate: f64,

    /// Share of payments for a payment id no order has (pay_x...).
    #[arg(long, env = "PROVIDER_UNMATCHED_RATE", value_name = "PROVIDER_UNMATCHED_RATE",
          default_value_t = 0.0, value_parser = parse_rate)]
    pub unmatched_rate: f64,

    /// Share of events delivered a second time, on the provider's own accord.
    #[arg(long, env = "PROVIDER_DUPLICATE_RATE", value_name = "PROVIDER_DUPLICATE_RATE",
          default_value_t = 0.0, value_parser = parse_rate)]
    pub duplicate_rate: f64,

    /// When the duplicate starts after the first delivery, in ms: "500" or
    /// "0..2000" (uniform).
    #[arg(
        long,
        env = "PROVIDER_DUPLICATE_DELAY_MS",
        value_name = "PROVIDER_DUPLICATE_DELAY_MS",
        default_value = "0..1000"
    )]
    pub duplicate_delay_ms: DelayRange,

    /// Share of duplicates held back until the rest of the run is over
    /// (a redelivery long after the first).
    #[arg(long, env = "PROVIDER_LATE_DUPLICATE_RATE", value_name = "PROVIDER_LATE_DUPLICATE_RATE",
          default_value_t = 0.0, value_parser = parse_rate)]
    pub late_duplicate_rate: f64,

    /// Pause between the end of the main phase and the late duplicates.
    #[arg(
        long,
        env = "PROVIDER_LATE_DELAY_MS",
        value_name = "PROVIDER_LATE_DELAY_MS",
        default_value_t = 2000
    )]
    pub late_delay_ms: u64,

    /// Share of events whose first delivery is a burst of concurrent ones.
    #[arg(long, env = "PROVIDER_BURST_RATE", value_name = "PROVIDER_BURST_RATE",
          default_value_t = 0.0, value_parser = parse_rate)]
    pub burst_rate: f64,

    /// Concurrent deliveries in a burst.
    #[arg(long, env = "PROVIDER_BURST_SIZE", value_name = "PROVIDER_BURST_SIZE", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub burst_size: u32,

    /// One attempt's time limit; past it the attempt is a timeout, retried.
    #[arg(long, env = "PROVIDER_TIMEOUT_MS", value_name = "PROVIDER_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: u64,

    /// First retry's backoff ceiling; doubles per retry (full jitter).
    #[arg(long, env = "PROVIDER_RETRY_BASE_MS", value_name = "PROVIDER_RETRY_BASE_MS",
          default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    pub retry_base_ms: u64,

    /// Largest backoff ceiling (a Retry-After may still ask for longer).
    #[arg(long, env = "PROVIDER_RETRY_MAX_MS", value_name = "PROVIDER_RETRY_MAX_MS",
          default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    pub retry_max_ms: u64,

    /// Retries per delivery; default: as many as fit in --give-up-after-ms.
    #[arg(long, env = "PROVIDER_MAX_RETRIES", value_name = "PROVIDER_MAX_RETRIES")]
    pub max_retries: Option<u32>,

    /// A delivery (first attempt and retries) gives up after this long.
    #[arg(long, env = "PROVIDER_GIVE_UP_AFTER_MS", value_name = "PROVIDER_GIVE_UP_AFTER_MS",
          default_value_t = 120_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub give_up_after_ms: u64,

    /// Write one JSON line per event once settled: event_id, type,
    /// payment_id, acknowledged, status, http_status, deliveries,
    /// acknowledged_at_ms (Unix ms when the first 2xx was read).
    #[arg(long, env = "PROVIDER_ACK_FILE", value_name = "PROVIDER_ACK_FILE")]
    pub ack_file: Option<PathBuf>,

    /// Print the summary as one JSON object on stdout.
    #[arg(long, env = "PROVIDER_JSON")]
    pub json: bool,

    /// Exit 0 also when some events were refused for good (4xx).
    #[arg(long, env = "PROVIDER_ALLOW_FAILURES")]
    pub allow_failures: bool,

    /// No progress line every second (the summary is still printed).
    #[arg(long, env = "PROVIDER_NO_PROGRESS")]
    pub no_progress: bool,

    /// Seed of the event mix (kinds, duplicates, bursts), to repeat a run.
    #[arg(long, env = "PROVIDER_SEED", value_name = "PROVIDER_SEED")]
    pub seed: Option<u64>,

    /// Runtime threads. One (the default) is the cheapest per request and
    /// pushes far more than an ingest on the same 2-core machine absorbs.
    #[arg(long, env = "PROVIDER_THREADS", value_name = "PROVIDER_THREADS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub threads: u16,
}

impl ProviderArgs {
    /// The library's configuration; fails (naming the flag and its
    /// variable) on what one flag alone cannot check.
    pub fn config(&self) -> Result<ProviderConfig, String> {
        let secret = self.signing.secret()?;
        let load = match self.rate {
            Some(rate) => Load::Open { rate },
            None => Load::Closed {
                concurrency: self.concurrency as usize,
            },
        };
        let config = ProviderConfig {
            targets: self.target.clone(),
            scheme: self.signing.scheme,
            secret,
            load,
            events: self.events,
            duration: self.duration_secs.map(Duration::from_secs_f64),
            run_id: self.run_id.clone().unwrap_or_else(default_run_id),
            mix: Mix {
                orders: self.orders,
                first_order: self.first_order,
                refund_rate: self.refund_rate,
                unknown_rate: self.unknown_rate,
                unmatched_rate: self.unmatched_rate,
            },
            duplicates: Duplicates {
                rate: self.duplicate_rate,
                delay: self.duplicate_delay_ms,
                late_rate: self.late_duplicate_rate,
                late_delay: Duration::from_millis(self.late_delay_ms),
            },
            bursts: Bursts {
                rate: self.burst_rate,
                size: self.burst_size,
            },
            timeout: Duration::from_millis(self.timeout_ms),
            retry: RetryPolicy {
                base: Duration::from_millis(self.retry_base_ms),
                max: Duration::from_millis(self.retry_max_ms),
                max_retries: self.max_retries,
                give_up_after: Duration::from_millis(self.give_up_after_ms),
            },
            ack_file: self.ack_file.clone(),
            keep_records: false,
            seed: self.seed,
        };
        if self.rate.is_some() && self.concurrency != 1 {
            return Err(with_variables(
                "--rate and --concurrency are exclusive: open or closed loop",
            ));
        }
        config.validate().map_err(|e| with_variables(&e))?;
        Ok(config)
    }
}

/// `--refund-rate` becomes `--refund-rate (PROVIDER_REFUND_RATE)`: the
/// library names flags, the command line also names their variables.
fn with_variables(message: &str) -> String {
    let mut out = String::with_capacity(message.len() + 32);
    let mut rest = message;
    while let Some(at) = rest.find("--") {
        let (before, from) = rest.split_at(at);
        out.push_str(before);
        let len = 2 + from[2..]
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
            .unwrap_or(from.len() - 2);
        let flag = &from[..len];
        out.push_str(flag);
        if len > 2 {
            out.push_str(&format!(
                " (PROVIDER_{})",
                flag[2..].replace('-', "_").to_ascii_uppercase()
            ));
        }
        rest = &from[len..];
    }
    out.push_str(rest);
    out
}
