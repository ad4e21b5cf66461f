//! What a run does: [`ProviderConfig`] and its parts. Every default here is
//! the command line's default, so `simulator provider` and a test that
//! builds the config in process behave the same.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::Url;
use signature::{Scheme, Secret};

/// The path the ingest serves webhooks on, appended to a target given as a
/// bare base URL (`http://127.0.0.1:8080`).
pub const WEBHOOK_PATH: &str = "/webhooks/payments";

/// Longest `--run-id`: event ids stay well under the ingest's 255 bytes.
const MAX_RUN_ID_LEN: usize = 64;

/// Everything a run needs. Build one with [`ProviderConfig::new`] and
/// change the fields that matter:
/// `ProviderConfig { events: Some(100), ..ProviderConfig::new(targets, scheme, secret) }`.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    /// Where deliveries go, tried in turn: attempt `k` of an event goes to
    /// target `(event + k) % len`, so the load is spread and a retry after
    /// a connection error goes to the next target. A URL whose path is `/`
    /// gets [`WEBHOOK_PATH`] appended; any other path is used as given.
    pub targets: Vec<Url>,
    pub scheme: Scheme,
    /// Parsed once: it holds the keyed HMAC state every signature starts from.
    pub secret: Secret,
    pub load: Load,
    /// Stop generating after this many events (`None`: only the duration limits).
    pub events: Option<u64>,
    /// Stop generating after this long (`None`: only the event count limits).
    /// Events already started are still delivered and retried.
    pub duration: Option<Duration>,
    /// Prefixes event ids (`evt_<run_id>_<n>`) and webhook ids, so repeated
    /// runs against one database never collide. Letters, digits, `-` and `_`.
    pub run_id: String,
    pub mix: Mix,
    pub duplicates: Duplicates,
    pub bursts: Bursts,
    /// One delivery attempt, connection and body included: past it the
    /// attempt counts as a timeout and is retried. Real providers wait 10 to
    /// 30 s; the ingest's own deadline (5 s) is well inside the default.
    pub timeout: Duration,
    pub retry: RetryPolicy,
    /// One JSON line per event once it is settled ([`super::AckRecord`]).
    pub ack_file: Option<PathBuf>,
    /// Keep every event's [`super::AckRecord`] in [`super::Report::records`]
    /// (tests); off, a long run's memory does not grow with its events.
    pub keep_records: bool,
    /// Seeds the event mix (kinds, duplicates, bursts, delays), so a run is
    /// repeatable; `None` draws one. Backoff jitter is always random.
    pub seed: Option<u64>,
}

impl ProviderConfig {
    /// One event at a time to `targets`, with every other setting at its
    /// default. Still needs [`Self::events`] or [`Self::duration`].
    pub fn new(targets: Vec<Url>, scheme: Scheme, secret: Secret) -> Self {
        Self {
            targets,
            scheme,
            secret,
            load: Load::Closed { concurrency: 1 },
            events: None,
            duration: None,
            run_id: default_run_id(),
            mix: Mix::default(),
            duplicates: Duplicates::default(),
            bursts: Bursts::default(),
            timeout: Duration::from_millis(10_000),
            retry: RetryPolicy::default(),
            ack_file: None,
            keep_records: false,
            seed: None,
        }
    }

    /// Every rule the types do not enforce; the message names the flag.
    pub fn validate(&self) -> Result<(), String> {
        if self.targets.is_empty() {
            return Err("--target: at least one target URL is needed".into());
        }
        for target in &self.targets {
            if !matches!(target.scheme(), "http" | "https") || target.host().is_none() {
                return Err(format!("--target: {target} is not an http(s) URL"));
            }
        }
        match self.load {
            Load::Closed { concurrency: 0 } => {
                return Err("--concurrency must be at least 1".into());
            }
            Load::Open { rate } if !(rate.is_finite() && rate > 0.0) => {
                return Err(format!(
                    "--rate must be a positive number of events per second, got {rate}"
                ));
            }
            _ => {}
        }
        if self.events.is_none() && self.duration.is_none() {
            return Err("give --events or --duration-secs (or both): a run needs an end".into());
        }
        if self.events == Some(0) {
            return Err("--events must be at least 1".into());
        }
        if self.duration.is_some_and(|d| d.is_zero()) {
            return Err("--duration-secs must be more than 0".into());
        }
        if self.run_id.is_empty()
            || self.run_id.len() > MAX_RUN_ID_LEN
            || !self
                .run_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!(
                "--run-id must be 1 to {MAX_RUN_ID_LEN} letters, digits, '-' or '_', got {:?}",
                self.run_id
            ));
        }
        self.mix.validate()?;
        for (flag, rate) in [
            ("--duplicate-rate", self.duplicates.rate),
            ("--late-duplicate-rate", self.duplicates.late_rate),
            ("--burst-rate", self.bursts.rate),
        ] {
            check_rate(flag, rate)?;
        }
        if self.bursts.size < 2 {
            return Err(format!(
                "--burst-size must be at least 2, got {}",
                self.bursts.size
            ));
        }
        if self.timeout.is_zero() {
            return Err("--timeout-ms must be more than 0".into());
        }
        if self.retry.base.is_zero() || self.retry.base > self.retry.max {
            return Err(format!(
                "--retry-base-ms must be more than 0 and at most --retry-max-ms, got {} and {}",
                self.retry.base.as_millis(),
                self.retry.max.as_millis()
            ));
        }
        if self.retry.give_up_after.is_zero() {
            return Err("--give-up-after-ms must be more than 0".into());
        }
        Ok(())
    }

    /// How many requests can be in flight at once in closed loop (a burst
    /// and a duplicate per sender at most), to size the connection pool;
    /// `None` in open loop, where only the server's speed bounds it.
    pub(crate) fn max_in_flight(&self) -> Option<usize> {
        match self.load {
            Load::Closed { concurrency } => {
                let per_sender = if self.bursts.rate > 0.0 {
                    self.bursts.size as usize
                } else {
                    1
                };
                let duplicates = usize::from(self.duplicates.rate > 0.0);
                Some(concurrency * (per_sender + duplicates))
            }
            Load::Open { .. } => None,
        }
    }
}

/// The default `--run-id`: the current Unix time in seconds.
pub fn default_run_id() -> String {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        .to_string()
}

fn check_rate(flag: &str, rate: f64) -> Result<(), String> {
    if (0.0..=1.0).contains(&rate) {
        Ok(())
    } else {
        Err(format!("{flag} must be between 0 and 1, got {rate}"))
    }
}

/// How events are paced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// `concurrency` senders; each starts its next event when the previous
    /// one is acknowledged or given up. Measures what the server sustains,
    /// but a slow answer also slows the load (coordinated omission).
    Closed { concurrency: usize },
    /// `rate` events per second on a fixed schedule, whatever the answers:
    /// the load a real provider offers. See [`super::stats`] for why
    /// latency is then measured from the schedule.
    Open { rate: f64 },
}

/// What the events are. The rates are shares of all events and add up to
/// at most 1; the rest are `payment.succeeded` for a seeded order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mix {
    /// Orders `pay_1 .. pay_<orders>` exist (as `make run` seeds them).
    /// Payment event `n` pays order `n`, wrapping past the last, so a run of
    /// at most `orders` events pays each order once.
    pub orders: u64,
    /// The number of the first of those orders (1 unless moved): with 101,
    /// event `n` pays order `100 + n`, so runs side by side pay orders apart.
    pub first_order: u64,
    /// `payment.refunded` of an order whose payment was already
    /// acknowledged (while there is none yet, a payment is sent instead).
    pub refund_rate: f64,
    /// An event type the ingest does not act on (`customer.updated`).
    pub unknown_rate: f64,
    /// A payment whose id matches no order (`pay_x<n>`).
    pub unmatched_rate: f64,
}

impl Default for Mix {
    fn default() -> Self {
        Self {
            orders: 1000,
            first_order: 1,
            refund_rate: 0.0,
            unknown_rate: 0.0,
            unmatched_rate: 0.0,
        }
    }
}

impl Mix {
    fn validate(&self) -> Result<(), String> {
        if self.orders == 0 {
            return Err("--orders must be at least 1".into());
        }
        if self.first_order == 0 {
            return Err("--first-order must be at least 1".into());
        }
        check_rate("--refund-rate", self.refund_rate)?;
        check_rate("--unknown-rate", self.unknown_rate)?;
        check_rate("--unmatched-rate", self.unmatched_rate)?;
        let sum = self.refund_rate + self.unknown_rate + self.unmatched_rate;
        if sum > 1.0 + 1e-9 {
            return Err(format!(
                "--refund-rate + --unknown-rate + --unmatched-rate must be at most 1, got {sum}"
            ));
        }
        Ok(())
    }
}

/// Deliveries a provider makes of its own accord: the same event again,
/// independent of the first delivery and of its outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Duplicates {
    /// Share of events delivered a second time.
    pub rate: f64,
    /// The second delivery starts this long after the first one's start.
    pub delay: DelayRange,
    /// Share of the duplicates held back until the main phase is over (plus
    /// [`Self::late_delay`]): a redelivery minutes apart, long after the
    /// first was processed, squeezed into seconds.
    pub late_rate: f64,
    /// Pause between the end of the main phase and the late duplicates.
    pub late_delay: Duration,
}

impl Default for Duplicates {
    fn default() -> Self {
        Self {
            rate: 0.0,
            delay: DelayRange {
                min_ms: 0,
                max_ms: 1000,
            },
            late_rate: 0.0,
            late_delay: Duration::from_millis(2000),
        }
    }
}

/// The same event sent several times at once: what a provider's parallel
/// workers do after a timeout, and the test of the claim's locking.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bursts {
    /// Share of events whose first delivery is a burst.
    pub rate: f64,
    /// Concurrent deliveries in a burst (each retried on its own).
    pub size: u32,
}

impl Default for Bursts {
    fn default() -> Self {
        Self { rate: 0.0, size: 5 }
    }
}

/// When a failed attempt is tried again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// The first backoff's ceiling; it doubles per retry.
    pub base: Duration,
    /// The ceiling's ceiling.
    pub max: Duration,
    /// Retries after the first attempt; `None`: as many as fit in
    /// [`Self::give_up_after`].
    pub max_retries: Option<u32>,
    /// How long one delivery (first attempt and retries) may take in all:
    /// no attempt starts, and none runs, past it. Real providers retry for
    /// days; two minutes is plenty on loopback and bounds a run.
    pub give_up_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(200),
            max: Duration::from_millis(5000),
            max_retries: None,
            give_up_after: Duration::from_millis(120_000),
        }
    }
}

/// A delay in milliseconds drawn uniformly from `min_ms..=max_ms`: `"500"`
/// (fixed) or `"0..2000"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelayRange {
    pub min_ms: u64,
    pub max_ms: u64,
}

impl DelayRange {
    pub(crate) fn sample(self, rng: &mut impl rand::Rng) -> Duration {
        Duration::from_millis(rng.random_range(self.min_ms..=self.max_ms))
    }
}

impl FromStr for DelayRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a delay in ms (\"500\") or a range (\"0..2000\")");
        let number = |t: &str| t.trim().parse::<u64>().map_err(|_| bad());
        let (min_ms, max_ms) = match s.split_once("..") {
            Some((low, high)) => (number(low)?, number(high)?),
            None => {
                let fixed = number(s)?;
                (fixed, fixed)
            }
        };
        if min_ms > max_ms {
            return Err(bad());
        }
        Ok(Self { min_ms, max_ms })
    }
}

impl fmt::Display for DelayRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.min_ms, self.max_ms)
    }
}

/// The URL an attempt posts to: [`WEBHOOK_PATH`] on a bare base URL.
pub(crate) fn endpoint(target: &Url) -> Url {
    if target.path() == "/" {
        let mut url = target.clone();
        url.set_path(WEBHOOK_PATH);
        url
    } else {
        target.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ProviderConfig {
        let secret = Secret::parse(Scheme::Stripe, "sk").unwrap();
        ProviderConfig {
            events: Some(10),
            ..ProviderConfig::new(
                vec!["http://127.0.0.1:8080".parse().unwrap()],
                Scheme::Stripe,
                secret,
            )
        }
    }

    #[test]
    fn delay_ranges() {
        assert_eq!(
            "0..2000".parse(),
            Ok(DelayRange {
                min_ms: 0,
                max_ms: 2000
            })
        );
        assert_eq!(
            "500".parse(),
            Ok(DelayRange {
                min_ms: 500,
                max_ms: 500
            })
        );
        for bad in ["", "5..1", "a..b", "-1..3", "1..", "1.5"] {
            assert!(bad.parse::<DelayRange>().is_err(), "{bad:?}");
        }
        let mut rng = rand::rng();
        for _ in 0..100 {
            let d = DelayRange {
                min_ms: 10,
                max_ms: 20,
            }
            .sample(&mut rng);
            assert!((10..=20).contains(&d.as_millis()));
        }
    }

    #[test]
    fn a_bare_target_gets_the_webhook_path() {
        let bare: Url = "http://127.0.0.1:8080".parse().unwrap();
        assert_eq!(
            endpoint(&bare).as_str(),
            "http://127.0.0.1:8080/webhooks/payments"
        );
        let full: Url = "http://h:1/hooks/in".parse().unwrap();
        assert_eq!(endpoint(&full).as_str(), "http://h:1/hooks/in");
    }

    #[test]
    fn validation_names_the_flag() {
        assert_eq!(config().validate(), Ok(()));
        type Change = fn(&mut ProviderConfig);
        let cases: [(Change, &str); 10] = [
            (|c| c.targets.clear(), "--target"),
            (|c| c.targets = vec!["ftp://x/".parse().unwrap()], "--target"),
            (|c| c.load = Load::Closed { concurrency: 0 }, "--concurrency"),
            (|c| c.load = Load::Open { rate: 0.0 }, "--rate"),
            (|c| c.events = None, "--duration-secs"),
            (|c| c.run_id = "a b".into(), "--run-id"),
            (|c| c.mix.refund_rate = 0.7, "at most 1"),
            (|c| c.bursts.size = 1, "--burst-size"),
            (|c| c.retry.base = Duration::from_secs(10), "--retry-base-ms"),
            (|c| c.duplicates.late_rate = 1.5, "--late-duplicate-rate"),
        ];
        for (change, flag) in cases {
            let mut c = config();
            c.mix.unknown_rate = 0.5;
            change(&mut c);
            let err = c.validate().unwrap_err();
            assert!(err.contains(flag), "{err}");
        }
    }

    #[test]
    fn the_pool_fits_the_closed_loop() {
        let mut c = config();
        c.load = Load::Closed { concurrency: 16 };
        assert_eq!(c.max_in_flight(), Some(16));
        c.bursts.rate = 0.1;
        c.duplicates.rate = 0.1;
        assert_eq!(c.max_in_flight(), Some(16 * 6));
        c.load = Load::Open { rate: 100.0 };
        assert_eq!(c.max_in_flight(), None);
    }
}
