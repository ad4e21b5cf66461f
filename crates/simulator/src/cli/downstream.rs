//! `simulator downstream`: the fulfilment and email APIs' address, workers
//! and injected faults.

use std::net::SocketAddr;

use process::LogFormat;

use super::parse_rate;
use crate::downstream::{DownstreamConfig, Faults, Latency};

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
    use crate::cli::{Cli, Command};
    use clap::Parser as _;

    fn parse(args: &[&str]) -> Result<DownstreamArgs, clap::Error> {
        match Cli::try_parse_from(args)?.command {
            Command::Downstream(args) => Ok(args),
            other => panic!("not downstream: {other:?}"),
        }
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
}
