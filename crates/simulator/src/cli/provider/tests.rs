//! `simulator provider`'s flags reach the library's configuration, and its
//! errors name the variable to fix.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser as _;
use reqwest::Url;
use signature::Scheme;

use super::{ProviderArgs, with_variables};
use crate::cli::{Cli, Command};
use crate::provider::{Bursts, DelayRange, Duplicates, Load, Mix, RetryPolicy};

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
        "--first-order",
        "7",
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
            first_order: 7,
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
