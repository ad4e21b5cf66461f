//! A provider configuration for tests: quick retries, a fixed seed and run
//! id, records kept.

use std::time::Duration;

use simulator::provider::{ProviderConfig, RetryPolicy, Scheme, Secret};

pub const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const STRIPE_SECRET: &str = "sk_test_provider";

/// `events` events to `targets`, signed with the scheme's test secret.
pub fn config(scheme: Scheme, targets: &[&str], events: u64) -> ProviderConfig {
    let secret = Secret::parse(scheme, secret_of(scheme)).unwrap();
    let targets = targets.iter().map(|t| t.parse().unwrap()).collect();
    ProviderConfig {
        events: Some(events),
        run_id: "t".into(),
        seed: Some(7),
        keep_records: true,
        timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            base: Duration::from_millis(5),
            max: Duration::from_millis(50),
            max_retries: None,
            give_up_after: Duration::from_secs(10),
        },
        ..ProviderConfig::new(targets, scheme, secret)
    }
}

pub fn secret_of(scheme: Scheme) -> &'static str {
    match scheme {
        Scheme::Standard => STANDARD_SECRET,
        Scheme::Stripe => STRIPE_SECRET,
    }
}
