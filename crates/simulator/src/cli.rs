//! The command line: one subcommand per simulated neighbour. Every flag is
//! also an environment variable (named in the flag's value, as in the
//! services, so a configuration error names what to fix).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use reqwest::Url;
use process::LogFormat;
use signature::{Scheme, Secret};

use crate::audit::AuditConfig;
use crate::downstream::{DownstreamConfig, Faults, Latency};
use crate::provider::{
    Bursts, DelayRange, Duplicates, Load, Mix, ProviderConfig, RetryPolicy, config::default_run_id,
};
use crate::proxy::{self, ProxyConfig};

#[derive(Debug, Parser)]
#[command(
    name = "simulator",
    version,
    about = "Simulated neighbours for tests, make run and make bench."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The downstream fulfilment (POST /shipments) and email (POST /emails)
    /// APIs, with idempotency keys and injected faults. Prints
    /// {"listening":"ADDR"} on stdout once bound, then serves until SIGTERM.
    Downstream(DownstreamArgs),
    /// The payment provider and load generator: signs events, delivers them
    /// to the ingest at least once (retries, duplicates, bursts), prints
    /// progress and a summary on stderr (and with --json the summary as one
    /// line on stdout). Exit 0 only if every event was acknowledged.
    Provider(ProviderArgs),
    /// A fault-injecting TCP proxy (delays, cuts, black holes, refusals) in
    /// front of --upstream, with faults changed at runtime by POST /faults
    /// on --control. Prints {"listening":"ADDR","control":"ADDR"} on stdout
    /// once bound, then forwards until SIGTERM.
    Proxy(ProxyArgs),
    /// One signed webhook, posted once, by hand: prints the status (with
    /// `Idempotent-Replayed: true` on a replay) and the ingest's answer.
    /// Exit 0 on a 2xx, 1 otherwise.
    Send(SendArgs),
    /// The product's promise checked per order after a run: the downstream's
    /// own records (GET /stats with keys) against the database's orders and
    /// processed events. Prints a table of rules with a count and example
    /// order ids each; exit 0 if every rule held, 1 otherwise.
    Audit(AuditArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct DownstreamArgs {
    /// Port 0 picks a free port (printed on stdout).
    #[arg(
        long,
        env = "DOWNSTREAM_LISTEN",
        value_name = "DOWNSTREAM_LISTEN",
        default_value = "127.0.0.1:0"
    )]
    pub listen: SocketAddr,

    /// HTTP worker threads.
    #[arg(long, env = "DOWNSTREAM_WORKERS", value_name = "DOWNSTREAM_WORKERS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub workers: u16,

    /// Behave like an API without idempotency keys: every request that gets
    /// through creates a new effect.
    #[arg(long, env = "DOWNSTREAM_NO_IDEMPOTENCY")]
    pub no_idempotency: bool,

    /// Time per request in ms: "0", "50", "10..200" (uniform) or
    /// "p50:10,p99:300" (log-normal with that median and 99th percentile).
    #[arg(
        long,
        env = "DOWNSTREAM_LATENCY_MS",
        value_name = "DOWNSTREAM_LATENCY_MS",
        default_value = "0"
    )]
    pub latency_ms: Latency,

    /// Share of requests answered 500, 502 or 503, without effect.
    #[arg(long, env = "DOWNSTREAM_ERROR_RATE", value_name = "DOWNSTREAM_ERROR_RATE",
          default_value_t = 0.0, value_parser = parse_rate)]
    pub error_rate: f64,

    /// Share of requests answered 429 with Retry-After, without effect.
    #[arg(long = "rate-429", env = "DOWNSTREAM_RATE_429", value_name = "DOWNSTREAM_RATE_429",
          default_value_t = 0.0, value_parser = parse_rate)]
    pub rate_429: f64,

    /// The Retry-After of every 429.
    #[arg(
        long,
        env = "DOWNSTREAM_RETRY_AFTER_SECS",
        value_name = "DOWNSTREAM_RETRY_AFTER_SECS",
        default_value_t = 1
    )]
    pub retry_after_secs: u64,

    /// Share of connections dropped without an answer, without effect.
    #[arg(long, env = "DOWNSTREAM_RESET_RATE", value_name = "DOWNSTREAM_RESET_RATE",
          default_value_t = 0.0, value_parser = parse_rate)]
    pub reset_rate: f64,

    /// Share of requests whose answer is held back --hang-ms (the effect is
    /// created at once: the work is done, the answer is late).
    #[arg(long, env = "DOWNSTREAM_HANG_RATE", value_name = "DOWNSTREAM_HANG_RATE",
          default_value_t = 0.0, value_parser = parse_rate)]
    pub hang_rate: f64,

    /// How long a hung request waits before its answer.
    #[arg(
        long,
        env = "DOWNSTREAM_HANG_MS",
        value_name = "DOWNSTREAM_HANG_MS",
        default_value_t = 60_000
    )]
    pub hang_ms: u64,

    /// Logs go to stderr (stdout carries only the listening line).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
}

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
    /// payment_id, acknowledged, status, http_status, deliveries.
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

#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs {
    /// Where clients connect; port 0 picks a free port (printed on stdout).
    #[arg(
        long,
        env = "PROXY_LISTEN",
        value_name = "PROXY_LISTEN",
        default_value = "127.0.0.1:0"
    )]
    pub listen: SocketAddr,

    /// Where connections are forwarded (IP:PORT).
    #[arg(long, env = "PROXY_UPSTREAM", value_name = "PROXY_UPSTREAM")]
    pub upstream: SocketAddr,

    /// The control endpoints (GET|POST /faults, GET /stats); port 0 picks a
    /// free port (printed on stdout).
    #[arg(
        long,
        env = "PROXY_CONTROL",
        value_name = "PROXY_CONTROL",
        default_value = "127.0.0.1:0"
    )]
    pub control: SocketAddr,

    /// Each chunk is held back this long, both ways.
    #[arg(
        long,
        env = "PROXY_DELAY_MS",
        value_name = "PROXY_DELAY_MS",
        default_value_t = 0
    )]
    pub delay_ms: u64,

    /// Cut connections (RST both sides) once this many bytes came from
    /// upstream; 0: as soon as the answer starts. Every connection, unless
    /// --cut-rate picks a share.
    #[arg(long, env = "PROXY_CUT_AFTER_BYTES", value_name = "PROXY_CUT_AFTER_BYTES")]
    pub cut_after_bytes: Option<u64>,

    /// Share of new connections cut (after --cut-after-bytes, default 0).
    #[arg(long, env = "PROXY_CUT_RATE", value_name = "PROXY_CUT_RATE",
          default_value_t = 0.0, value_parser = parse_rate)]
    pub cut_rate: f64,

    /// Share of new connections black-holed: read, never forwarded, never answered.
    #[arg(long, env = "PROXY_BLACKHOLE_RATE", value_name = "PROXY_BLACKHOLE_RATE",
          default_value_t = 0.0, value_parser = parse_rate)]
    pub blackhole_rate: f64,

    /// Black-hole every connection, open ones included.
    #[arg(long, env = "PROXY_BLACKHOLE")]
    pub blackhole: bool,

    /// Refuse connections (the listener is closed) and reset open ones.
    #[arg(long, env = "PROXY_REFUSE")]
    pub refuse: bool,

    /// Logs go to stderr (stdout carries only the listening line).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
}

impl ProxyArgs {
    /// The library's configuration; fails when the rates add up to more than 1.
    pub fn config(&self) -> Result<ProxyConfig, String> {
        let faults = proxy::Faults {
            delay_ms: self.delay_ms,
            cut_after_bytes: self.cut_after_bytes,
            cut_rate: self.cut_rate,
            blackhole_rate: self.blackhole_rate,
            blackhole: self.blackhole,
            refuse: self.refuse,
        };
        faults.validate().map_err(|e| {
            e.replace("cut_rate", "--cut-rate (PROXY_CUT_RATE)")
                .replace("blackhole_rate", "--blackhole-rate (PROXY_BLACKHOLE_RATE)")
        })?;
        Ok(ProxyConfig {
            listen: self.listen,
            upstream: self.upstream,
            control: Some(self.control),
            faults,
        })
    }
}

/// How the provider signs, shared by `provider` and `send`.
#[derive(Debug, Clone, clap::Args)]
pub struct SigningArgs {
    /// The signing secret, as the ingest's WEBHOOK_SECRETS has it
    /// (`whsec_<base64>` for standard, any string for stripe).
    #[arg(
        long,
        env = "PROVIDER_SECRET",
        value_name = "PROVIDER_SECRET",
        hide_env_values = true
    )]
    pub secret: String,

    /// Signature scheme: standard (Standard Webhooks) or stripe.
    #[arg(long, env = "PROVIDER_SCHEME", value_name = "PROVIDER_SCHEME", default_value = "standard",
          value_parser = parse_scheme)]
    pub scheme: Scheme,
}

impl SigningArgs {
    /// The parsed secret; fails naming the flag and its variable.
    pub fn secret(&self) -> Result<Secret, String> {
        Secret::parse(self.scheme, &self.secret).map_err(|e| format!("--secret (PROVIDER_SECRET): {e}"))
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct SendArgs {
    /// The order's payment id (`pay_42` is order 42 in `make run`).
    pub payment_id: String,

    /// The event's type.
    #[arg(long = "type", value_name = "TYPE", default_value = "payment.succeeded")]
    pub event_type: String,

    /// The event id, the ingest's dedup key (default: a new evt_hand_<random>);
    /// send one again to see the stored answer replayed.
    #[arg(long)]
    pub id: Option<String>,

    /// The amount, in minor units.
    #[arg(long, default_value_t = 4200)]
    pub amount: i64,

    /// The ingest (a bare base URL gets /webhooks/payments appended).
    #[arg(
        long,
        env = "PROVIDER_TARGET",
        value_name = "PROVIDER_TARGET",
        default_value = "http://127.0.0.1:8080"
    )]
    pub target: Url,

    #[command(flatten)]
    pub signing: SigningArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// The database the ingest wrote (libpq URL; sslmode honoured).
    #[arg(
        long,
        env = "DATABASE_URL",
        value_name = "DATABASE_URL",
        hide_env_values = true
    )]
    pub database_url: String,

    /// The downstream's base URL, as the relay's FULFILMENT_URL and EMAIL_URL.
    #[arg(long, env = "DOWNSTREAM_URL", value_name = "DOWNSTREAM_URL")]
    pub downstream: Url,

    /// The relay's lease: a shipment call arriving later than this after the
    /// order's refund cannot have been claimed before it.
    #[arg(long, env = "RELAY_LEASE_SECS", value_name = "RELAY_LEASE_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub lease_secs: u64,

    /// Only orders paid this many seconds back (by the database's clock)
    /// need their confirmation at this downstream; default: every paid order.
    #[arg(long, env = "AUDIT_SINCE_SECS", value_name = "AUDIT_SINCE_SECS")]
    pub since_secs: Option<u64>,

    /// Also write the report as JSON to this file.
    #[arg(long, env = "AUDIT_JSON_FILE", value_name = "AUDIT_JSON_FILE")]
    pub json_file: Option<PathBuf>,
}

impl AuditArgs {
    /// The library's configuration; fails naming DATABASE_URL on a bad URL
    /// (without repeating it: it may hold a password).
    pub fn config(&self) -> Result<AuditConfig, String> {
        let database = db::Database::parse(&self.database_url)
            .map_err(|e| format!("--database-url (DATABASE_URL): {e}"))?;
        Ok(AuditConfig {
            database,
            downstream: self.downstream.clone(),
            lease: Duration::from_secs(self.lease_secs),
            since: self.since_secs.map(Duration::from_secs),
        })
    }
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

fn parse_scheme(s: &str) -> Result<Scheme, String> {
    Scheme::parse(s).ok_or_else(|| format!("{s:?} is not a scheme: standard or stripe"))
}

fn parse_positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(value) if value.is_finite() && value > 0.0 => Ok(value),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => Ok(rate),
        _ => Err(format!("{s:?} is not a rate between 0 and 1")),
    }
}

impl DownstreamArgs {
    /// The library's configuration; fails when the rates add up to more than 1.
    pub fn config(&self) -> Result<DownstreamConfig, String> {
        let faults = Faults {
            latency_ms: self.latency_ms,
            error_rate: self.error_rate,
            rate_429: self.rate_429,
            retry_after_secs: self.retry_after_secs,
            reset_rate: self.reset_rate,
            hang_rate: self.hang_rate,
            hang_ms: self.hang_ms,
        };
        faults.validate()?;
        Ok(DownstreamConfig {
            listen: self.listen,
            workers: usize::from(self.workers),
            idempotency: !self.no_idempotency,
            faults,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<DownstreamArgs, clap::Error> {
        match Cli::try_parse_from(args)?.command {
            Command::Downstream(args) => Ok(args),
            other => panic!("not downstream: {other:?}"),
        }
    }

    /// `simulator provider ARGS`, with a target and a secret unless given.
    fn provider(args: &[&str]) -> Result<ProviderArgs, clap::Error> {
        let mut all = vec!["simulator", "provider"];
        if !args.contains(&"--target") {
            all.extend(["--target", "http://127.0.0.1:8080"]);
        }
        if !args.contains(&"--secret") {
            all.extend(["--secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]);
        }
        all.extend(args);
        match Cli::try_parse_from(all)?.command {
            Command::Provider(args) => Ok(args),
            other => panic!("not provider: {other:?}"),
        }
    }

    #[test]
    fn provider_defaults() {
        let config = provider(&["--scheme", "stripe", "--events", "10"])
            .unwrap()
            .config()
            .unwrap();
        assert_eq!(config.targets, ["http://127.0.0.1:8080".parse::<Url>().unwrap()]);
        assert_eq!(config.scheme, Scheme::Stripe);
        assert_eq!(config.load, Load::Closed { concurrency: 1 });
        assert_eq!((config.events, config.duration), (Some(10), None));
        assert!(config.run_id.parse::<u64>().unwrap() > 1_700_000_000);
        assert_eq!(config.mix, Mix::default());
        assert_eq!(config.mix.orders, 1000);
        assert_eq!(config.duplicates, Duplicates::default());
        assert_eq!(
            config.duplicates.delay,
            DelayRange {
                min_ms: 0,
                max_ms: 1000
            }
        );
        assert_eq!(config.bursts, Bursts { rate: 0.0, size: 5 });
        assert_eq!(config.timeout, Duration::from_secs(10));
        assert_eq!(config.retry, RetryPolicy::default());
        assert_eq!(config.retry.give_up_after, Duration::from_secs(120));
        assert_eq!(config.ack_file, None);
        let args = provider(&["--events", "1"]).unwrap();
        assert_eq!(args.signing.scheme, Scheme::Standard);
        assert!(!args.json && !args.allow_failures && !args.no_progress);
        assert_eq!(args.threads, 1);
    }

    #[test]
    fn provider_flags_reach_the_config() {
        let config = provider(&[
            "--target",
            "http://127.0.0.1:8080,http://127.0.0.1:8081/hooks",
            "--rate",
            "250.5",
            "--duration-secs",
            "1.5",
            "--run-id",
            "bench-1",
            "--orders",
            "50",
            "--refund-rate",
            "0.1",
            "--unknown-rate",
            "0.2",
            "--unmatched-rate",
            "0.3",
            "--duplicate-rate",
            "0.4",
            "--duplicate-delay-ms",
            "5..50",
            "--late-duplicate-rate",
            "0.5",
            "--late-delay-ms",
            "100",
            "--burst-rate",
            "0.05",
            "--burst-size",
            "8",
            "--timeout-ms",
            "300",
            "--retry-base-ms",
            "10",
            "--retry-max-ms",
            "100",
            "--max-retries",
            "3",
            "--give-up-after-ms",
            "1000",
            "--ack-file",
            "/tmp/acks.jsonl",
            "--seed",
            "42",
        ])
        .unwrap()
        .config()
        .unwrap();
        assert_eq!(config.targets.len(), 2);
        assert_eq!(config.targets[1].path(), "/hooks");
        assert_eq!(config.load, Load::Open { rate: 250.5 });
        assert_eq!(config.duration, Some(Duration::from_millis(1500)));
        assert_eq!(config.run_id, "bench-1");
        assert_eq!(
            config.mix,
            Mix {
                orders: 50,
                refund_rate: 0.1,
                unknown_rate: 0.2,
                unmatched_rate: 0.3
            }
        );
        assert_eq!(
            config.duplicates.delay,
            DelayRange {
                min_ms: 5,
                max_ms: 50
            }
        );
        assert_eq!(config.duplicates.late_delay, Duration::from_millis(100));
        assert_eq!(config.bursts, Bursts { rate: 0.05, size: 8 });
        assert_eq!(config.retry.max_retries, Some(3));
        assert_eq!(config.retry.base, Duration::from_millis(10));
        assert_eq!(config.ack_file, Some(PathBuf::from("/tmp/acks.jsonl")));
        assert_eq!(config.seed, Some(42));
    }

    #[test]
    fn provider_errors_name_the_variable() {
        let err = provider(&["--events", "1", "--refund-rate", "2"]).unwrap_err();
        assert!(err.to_string().contains("PROVIDER_REFUND_RATE"), "{err}");
        let err = provider(&["--events", "1", "--scheme", "hmac"]).unwrap_err();
        assert!(err.to_string().contains("PROVIDER_SCHEME"), "{err}");
        let err = provider(&["--events", "1", "--burst-size", "1"]).unwrap_err();
        assert!(err.to_string().contains("PROVIDER_BURST_SIZE"), "{err}");
        let err = provider(&["--events", "1", "--duplicate-delay-ms", "9..1"]).unwrap_err();
        assert!(err.to_string().contains("PROVIDER_DUPLICATE_DELAY_MS"), "{err}");

        let config_err = |args: &[&str]| provider(args).unwrap().config().unwrap_err();
        let err = config_err(&["--events", "1", "--refund-rate", "0.6", "--unknown-rate", "0.6"]);
        assert!(
            err.contains("PROVIDER_REFUND_RATE") && err.contains("at most 1"),
            "{err}"
        );
        let err = config_err(&[]);
        assert!(err.contains("--events (PROVIDER_EVENTS)"), "{err}");
        let err = config_err(&["--events", "1", "--rate", "10", "--concurrency", "4"]);
        assert!(err.contains("PROVIDER_CONCURRENCY"), "{err}");
        let err = config_err(&["--events", "1", "--secret", "whsec_!!"]);
        assert!(err.contains("PROVIDER_SECRET") && !err.contains("!!"), "{err}");
        let err = config_err(&["--events", "1", "--retry-base-ms", "900", "--retry-max-ms", "10"]);
        assert!(err.contains("PROVIDER_RETRY_BASE_MS"), "{err}");
    }

    #[test]
    fn variables_are_named_beside_flags() {
        assert_eq!(
            with_variables("--a-b and --c, not -- or -x"),
            "--a-b (PROVIDER_A_B) and --c (PROVIDER_C), not -- or -x"
        );
    }

    #[test]
    fn defaults_are_a_fault_free_loopback_downstream() {
        let config = parse(&["simulator", "downstream"]).unwrap().config().unwrap();
        assert_eq!(config.listen, "127.0.0.1:0".parse().unwrap());
        assert_eq!(config.workers, 1);
        assert!(config.idempotency);
        assert_eq!(config.faults, Faults::default());
    }

    #[test]
    fn fault_flags_reach_the_config() {
        let args = parse(&[
            "simulator",
            "downstream",
            "--listen",
            "127.0.0.1:7000",
            "--no-idempotency",
            "--latency-ms",
            "p50:10,p99:300",
            "--error-rate",
            "0.1",
            "--rate-429",
            "0.2",
            "--retry-after-secs",
            "3",
            "--reset-rate",
            "0.05",
            "--hang-rate",
            "0.01",
            "--hang-ms",
            "500",
            "--workers",
            "2",
        ])
        .unwrap();
        let config = args.config().unwrap();
        assert!(!config.idempotency);
        assert_eq!(config.workers, 2);
        assert_eq!(
            config.faults.latency_ms,
            Latency::LongTail {
                p50: 10.0,
                p99: 300.0
            }
        );
        assert_eq!(config.faults.rate_429, 0.2);
        assert_eq!(config.faults.retry_after_secs, 3);
        assert_eq!(config.faults.hang_ms, 500);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let err = parse(&["simulator", "downstream", "--error-rate", "2"]).unwrap_err();
        assert!(err.to_string().contains("DOWNSTREAM_ERROR_RATE"), "{err}");
        let err = parse(&["simulator", "downstream", "--latency-ms", "fast"]).unwrap_err();
        assert!(err.to_string().contains("DOWNSTREAM_LATENCY_MS"), "{err}");
        let too_much = parse(&[
            "simulator",
            "downstream",
            "--error-rate",
            "0.6",
            "--reset-rate",
            "0.6",
        ]);
        assert!(too_much.unwrap().config().unwrap_err().contains("at most 1"));
    }

    fn proxy(args: &[&str]) -> Result<ProxyArgs, clap::Error> {
        let mut all = vec!["simulator", "proxy"];
        all.extend(args);
        match Cli::try_parse_from(all)?.command {
            Command::Proxy(args) => Ok(args),
            other => panic!("not proxy: {other:?}"),
        }
    }

    #[test]
    fn proxy_defaults_are_a_fault_free_loopback_proxy() {
        let config = proxy(&["--upstream", "127.0.0.1:7000"])
            .unwrap()
            .config()
            .unwrap();
        assert_eq!(config.listen, "127.0.0.1:0".parse().unwrap());
        assert_eq!(config.upstream, "127.0.0.1:7000".parse().unwrap());
        assert_eq!(config.control, Some("127.0.0.1:0".parse().unwrap()));
        assert_eq!(config.faults, proxy::Faults::default());
    }

    #[test]
    fn proxy_fault_flags_reach_the_config() {
        let config = proxy(&[
            "--upstream",
            "127.0.0.1:7000",
            "--listen",
            "127.0.0.1:7001",
            "--control",
            "127.0.0.1:7002",
            "--delay-ms",
            "250",
            "--cut-after-bytes",
            "10",
            "--cut-rate",
            "0.25",
            "--blackhole-rate",
            "0.5",
            "--blackhole",
            "--refuse",
        ])
        .unwrap()
        .config()
        .unwrap();
        assert_eq!(config.listen.port(), 7001);
        assert_eq!(config.control, Some("127.0.0.1:7002".parse().unwrap()));
        assert_eq!(
            config.faults,
            proxy::Faults {
                delay_ms: 250,
                cut_after_bytes: Some(10),
                cut_rate: 0.25,
                blackhole_rate: 0.5,
                blackhole: true,
                refuse: true,
            }
        );
    }

    #[test]
    fn proxy_errors_name_the_variable() {
        let err = proxy(&[]).unwrap_err();
        assert!(err.to_string().contains("PROXY_UPSTREAM"), "{err}");
        let err = proxy(&["--upstream", "downstream"]).unwrap_err();
        assert!(err.to_string().contains("PROXY_UPSTREAM"), "{err}");
        let err = proxy(&["--upstream", "127.0.0.1:1", "--cut-rate", "2"]).unwrap_err();
        assert!(err.to_string().contains("PROXY_CUT_RATE"), "{err}");
        let err = proxy(&["--upstream", "127.0.0.1:1", "--delay-ms", "soon"]).unwrap_err();
        assert!(err.to_string().contains("PROXY_DELAY_MS"), "{err}");
        let err = proxy(&[
            "--upstream",
            "127.0.0.1:1",
            "--cut-rate",
            "0.6",
            "--blackhole-rate",
            "0.6",
        ])
        .unwrap()
        .config()
        .unwrap_err();
        assert!(
            err.contains("PROXY_CUT_RATE")
                && err.contains("PROXY_BLACKHOLE_RATE")
                && err.contains("at most 1"),
            "{err}"
        );
    }
}
