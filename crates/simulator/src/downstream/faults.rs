//! What can go wrong, and how often: the fault settings (flags at start,
//! `POST /control/faults` at runtime), per-key scripts, and the draw that
//! turns them into one [`Step`] per request.
//!
//! A request draws at most one fault: the rates partition `[0, 1)` (reset,
//! hang, 429, 5xx in that order), so each happens at exactly its configured
//! rate and their sum may not exceed 1. With every rate at zero nothing is
//! drawn at all, which keeps the benchmark path free of random numbers.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use actix_web::http::StatusCode;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The fault settings. Every field has a default that means "no fault", so a
/// JSON object that omits a field resets it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Time spent on each request before answering.
    pub latency_ms: Latency,
    /// Share of requests answered 500, 502 or 503 (chosen uniformly), without effect.
    pub error_rate: f64,
    /// Share of requests answered 429 with `Retry-After`, without effect.
    pub rate_429: f64,
    /// The `Retry-After` of every 429, scripted or drawn.
    pub retry_after_secs: u64,
    /// Share of connections dropped without any response, without effect.
    pub reset_rate: f64,
    /// Share of requests answered only after `hang_ms`.
    ///
    /// Unlike the other faults, a hung request is processed normally and
    /// its effect is created at once, as by a real API that did the work and
    /// then stalled: the client times out without knowing, and only its
    /// retry with the same key (a replay) tells it the outcome. That is the
    /// failure idempotency keys exist for; with `--no-idempotency` it is what
    /// makes a double effect.
    pub hang_rate: f64,
    /// How long a hung request waits. The default is well past any sane
    /// client timeout, so the client gives up first.
    pub hang_ms: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            latency_ms: Latency::Zero,
            error_rate: 0.0,
            rate_429: 0.0,
            retry_after_secs: 1,
            reset_rate: 0.0,
            hang_rate: 0.0,
            hang_ms: 60_000,
        }
    }
}

impl Faults {
    /// Rates within `[0, 1]` and adding up to at most 1.
    pub fn validate(&self) -> Result<(), String> {
        let rates = [
            ("error_rate", self.error_rate),
            ("rate_429", self.rate_429),
            ("reset_rate", self.reset_rate),
            ("hang_rate", self.hang_rate),
        ];
        for (name, rate) in rates {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("{name} must be between 0 and 1, got {rate}"));
            }
        }
        let sum: f64 = rates.iter().map(|(_, r)| r).sum();
        if sum > 1.0 + 1e-9 {
            return Err(format!(
                "error_rate + rate_429 + reset_rate + hang_rate must be at most 1, got {sum}"
            ));
        }
        Ok(())
    }

    /// Whether any fault can be drawn (latency aside).
    fn any_rate(&self) -> bool {
        self.error_rate > 0.0 || self.rate_429 > 0.0 || self.reset_rate > 0.0 || self.hang_rate > 0.0
    }

    /// This request's fate according to the rates.
    pub(crate) fn draw(&self) -> Step {
        if !self.any_rate() {
            return Step::Proceed;
        }
        let mut u: f64 = rand::random();
        for (rate, step) in [
            (self.reset_rate, Step::Fail(Failure::Reset)),
            (self.hang_rate, Step::Hang),
            (
                self.rate_429,
                Step::Fail(Failure::Status(StatusCode::TOO_MANY_REQUESTS)),
            ),
        ] {
            if u < rate {
                return step;
            }
            u -= rate;
        }
        if u < self.error_rate {
            const ERRORS: [StatusCode; 3] = [
                StatusCode::INTERNAL_SERVER_ERROR,
                StatusCode::BAD_GATEWAY,
                StatusCode::SERVICE_UNAVAILABLE,
            ];
            return Step::Fail(Failure::Status(ERRORS[rand::random_range(0..ERRORS.len())]));
        }
        Step::Proceed
    }

    pub(crate) fn hang(&self) -> Duration {
        Duration::from_millis(self.hang_ms)
    }
}

/// What happens to one request, drawn from the rates or taken from the key's script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Normal processing: create the effect, replay, 409 or 422.
    Proceed,
    /// Normal processing, the effect created at once, the answer held back
    /// for `hang_ms`: see [`Faults::hang_rate`].
    Hang,
    /// An injected failure: no effect, nothing stored for the key.
    Fail(Failure),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Answer this status (a 429 carries `Retry-After`).
    Status(StatusCode),
    /// Drop the connection without answering.
    Reset,
}

/// One entry of a key's script (`POST /control/script`): a status code, or
/// `"reset"` or `"hang"`. Any 2xx means "process normally" (the answer is
/// then the endpoint's own 201 or 202, or a replay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptStep {
    Proceed,
    Status(u16),
    Reset,
    Hang,
}

impl ScriptStep {
    pub(crate) fn step(self) -> Step {
        match self {
            Self::Proceed => Step::Proceed,
            Self::Hang => Step::Hang,
            Self::Reset => Step::Fail(Failure::Reset),
            Self::Status(code) => Step::Fail(Failure::Status(
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            )),
        }
    }
}

impl FromStr for ScriptStep {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "reset" => Ok(Self::Reset),
            "hang" => Ok(Self::Hang),
            _ => s
                .parse::<u16>()
                .map_err(|_| format!("script entry {s:?} is not a status code, \"reset\" or \"hang\""))
                .and_then(Self::try_from),
        }
    }
}

impl TryFrom<u16> for ScriptStep {
    type Error = String;

    fn try_from(code: u16) -> Result<Self, String> {
        match code {
            200..=299 => Ok(Self::Proceed),
            300..=599 => Ok(Self::Status(code)),
            _ => Err(format!("script status {code} is outside 200..=599")),
        }
    }
}

impl<'de> Deserialize<'de> for ScriptStep {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Code(u16),
            Word(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Code(code) => Self::try_from(code),
            Raw::Word(word) => word.parse(),
        }
        .map_err(serde::de::Error::custom)
    }
}

impl Serialize for ScriptStep {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Proceed => serializer.serialize_u16(200),
            Self::Status(code) => serializer.serialize_u16(*code),
            Self::Reset => serializer.serialize_str("reset"),
            Self::Hang => serializer.serialize_str("hang"),
        }
    }
}

/// How long a request takes, in milliseconds: `"0"`, `"50"` (fixed),
/// `"10..200"` (uniform) or `"p50:10,p99:300"` (log-normal with that median
/// and 99th percentile: most requests are quick, a few are very slow, as in
/// real services).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Latency {
    #[default]
    Zero,
    Fixed(f64),
    Uniform {
        low: f64,
        high: f64,
    },
    LongTail {
        p50: f64,
        p99: f64,
    },
}

/// The 99th percentile of the standard normal distribution.
const Z_99: f64 = 2.326_347_874_040_841;

/// No single request waits longer than this, whatever the tail: a
/// distribution's rare extreme draw must not outlast a test.
const MAX_LATENCY_MS: f64 = 600_000.0;

impl Latency {
    pub(crate) fn sample(&self) -> Duration {
        let ms = match *self {
            Self::Zero => return Duration::ZERO,
            Self::Fixed(ms) => ms,
            Self::Uniform { low, high } => low + (high - low) * rand::random::<f64>(),
            Self::LongTail { p50, p99 } => {
                let sigma = (p99 / p50).ln() / Z_99;
                p50 * (sigma * standard_normal()).exp()
            }
        };
        Duration::from_secs_f64(ms.clamp(0.0, MAX_LATENCY_MS) / 1000.0)
    }
}

/// Box-Muller: one draw from N(0, 1).
fn standard_normal() -> f64 {
    // 1 - u lies in (0, 1], so the logarithm is finite.
    let u1 = 1.0 - rand::random::<f64>();
    let u2: f64 = rand::random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn parse_ms(s: &str) -> Result<f64, String> {
    let ms: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of milliseconds"))?;
    if !(0.0..=MAX_LATENCY_MS).contains(&ms) {
        return Err(format!("{ms} ms is outside 0..={MAX_LATENCY_MS}"));
    }
    Ok(ms)
}

impl FromStr for Latency {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Some((low, high)) = s.split_once("..") {
            let (low, high) = (parse_ms(low)?, parse_ms(high)?);
            if low > high {
                return Err(format!("latency range {s:?} is empty"));
            }
            return Ok(Self::Uniform { low, high });
        }
        if s.contains(':') {
            let (mut p50, mut p99) = (None, None);
            for part in s.split(',') {
                match part.trim().split_once(':') {
                    Some(("p50", v)) => p50 = Some(parse_ms(v)?),
                    Some(("p99", v)) => p99 = Some(parse_ms(v)?),
                    _ => return Err(format!("latency {s:?}: expected \"p50:MS,p99:MS\"")),
                }
            }
            let (Some(p50), Some(p99)) = (p50, p99) else {
                return Err(format!("latency {s:?}: both p50 and p99 are needed"));
            };
            if p50 <= 0.0 || p99 < p50 {
                return Err(format!("latency {s:?}: need 0 < p50 <= p99"));
            }
            return Ok(Self::LongTail { p50, p99 });
        }
        let ms = parse_ms(s)?;
        Ok(if ms == 0.0 { Self::Zero } else { Self::Fixed(ms) })
    }
}

impl fmt::Display for Latency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Zero => f.write_str("0"),
            Self::Fixed(ms) => write!(f, "{ms}"),
            Self::Uniform { low, high } => write!(f, "{low}..{high}"),
            Self::LongTail { p50, p99 } => write!(f, "p50:{p50},p99:{p99}"),
        }
    }
}

/// Written as its spec string; read from a spec string or a plain number.
impl Serialize for Latency {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Latency {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Spec(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Number(ms) => ms.to_string().parse(),
            Raw::Spec(spec) => spec.parse(),
        }
        .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_specs_parse_and_print_back() {
        for spec in ["0", "50", "10..200", "p50:10,p99:300", "0.5"] {
            let latency: Latency = spec.parse().unwrap();
            assert_eq!(latency.to_string().parse::<Latency>().unwrap(), latency, "{spec}");
        }
        assert_eq!("0".parse::<Latency>().unwrap(), Latency::Zero);
        assert_eq!(
            "p99:300, p50:10".parse::<Latency>().unwrap(),
            Latency::LongTail {
                p50: 10.0,
                p99: 300.0
            }
        );
        for bad in [
            "",
            "x",
            "-1",
            "200..10",
            "p50:10",
            "p50:300,p99:10",
            "p90:1,p99:2",
            "1..x",
        ] {
            assert!(bad.parse::<Latency>().is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn long_tail_matches_its_quantiles() {
        let latency: Latency = "p50:10,p99:300".parse().unwrap();
        let mut samples: Vec<f64> = (0..20_000)
            .map(|_| latency.sample().as_secs_f64() * 1000.0)
            .collect();
        samples.sort_by(f64::total_cmp);
        let p50 = samples[samples.len() / 2];
        let p99 = samples[samples.len() * 99 / 100];
        assert!((8.0..12.5).contains(&p50), "p50 {p50}");
        assert!((200.0..450.0).contains(&p99), "p99 {p99}");
    }

    #[test]
    fn uniform_stays_in_its_range() {
        let latency: Latency = "10..20".parse().unwrap();
        for _ in 0..1000 {
            let ms = latency.sample().as_secs_f64() * 1000.0;
            assert!((10.0..=20.0).contains(&ms), "{ms}");
        }
    }

    #[test]
    fn rates_are_checked() {
        let ok = Faults {
            error_rate: 0.5,
            rate_429: 0.5,
            ..Faults::default()
        };
        assert!(ok.validate().is_ok());
        let too_much = Faults {
            reset_rate: 0.7,
            ..ok
        };
        assert!(too_much.validate().unwrap_err().contains("at most 1"));
        let negative = Faults {
            hang_rate: -0.1,
            ..Faults::default()
        };
        assert!(negative.validate().unwrap_err().contains("hang_rate"));
    }

    #[test]
    fn draws_follow_the_rates() {
        assert_eq!(Faults::default().draw(), Step::Proceed);
        let always_reset = Faults {
            reset_rate: 1.0,
            ..Faults::default()
        };
        assert_eq!(always_reset.draw(), Step::Fail(Failure::Reset));
        let split = Faults {
            rate_429: 0.25,
            error_rate: 0.25,
            ..Faults::default()
        };
        let n = 20_000;
        let (mut limited, mut errors) = (0, 0);
        for _ in 0..n {
            match split.draw() {
                Step::Fail(Failure::Status(StatusCode::TOO_MANY_REQUESTS)) => limited += 1,
                Step::Fail(Failure::Status(s)) => {
                    assert!(s.is_server_error());
                    errors += 1;
                }
                Step::Proceed => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        for count in [limited, errors] {
            let share = f64::from(count) / f64::from(n);
            assert!((0.22..0.28).contains(&share), "{share}");
        }
    }

    #[test]
    fn faults_json_omitted_fields_reset_and_unknown_ones_fail() {
        let faults: Faults = serde_json::from_str(r#"{"latency_ms": 5, "error_rate": 0.1}"#).unwrap();
        assert_eq!(faults.latency_ms, Latency::Fixed(5.0));
        assert_eq!(faults.retry_after_secs, 1);
        assert_eq!(faults.hang_ms, 60_000);
        assert!(serde_json::from_str::<Faults>(r#"{"eror_rate": 0.1}"#).is_err());
        let back: Faults = serde_json::from_str(&serde_json::to_string(&faults).unwrap()).unwrap();
        assert_eq!(back, faults);
    }

    #[test]
    fn script_entries() {
        let steps: Vec<ScriptStep> =
            serde_json::from_str(r#"[500, 200, "reset", "hang", 429, "503"]"#).unwrap();
        assert_eq!(
            steps,
            [
                ScriptStep::Status(500),
                ScriptStep::Proceed,
                ScriptStep::Reset,
                ScriptStep::Hang,
                ScriptStep::Status(429),
                ScriptStep::Status(503),
            ]
        );
        assert!(serde_json::from_str::<Vec<ScriptStep>>("[99]").is_err());
        assert!(serde_json::from_str::<Vec<ScriptStep>>(r#"["later"]"#).is_err());
    }
}
