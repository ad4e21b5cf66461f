//! The retry policy: from what a call produced ([`CallResult`]) to what is
//! recorded for its row ([`Verdict`]), with exponential backoff and full
//! jitter.

use std::time::Duration;

use rand::Rng as _;

use crate::dispatch::CallResult;
use crate::storage::Verdict;

/// The retry policy (`RELAY_MAX_ATTEMPTS`, `RELAY_BACKOFF_BASE_MS`,
/// `RELAY_BACKOFF_MAX_SECS`).
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub base: Duration,
    pub max: Duration,
}

impl RetryPolicy {
    /// The verdict on a row whose attempt number `attempt` (1-based) came to
    /// `result`: a transient failure is retried until the last allowed
    /// attempt, then dead with the last error.
    pub fn verdict(&self, attempt: i32, result: CallResult) -> Verdict {
        match result {
            CallResult::Succeeded { .. } => Verdict::Done,
            CallResult::Permanent { error, .. } => Verdict::Dead { error },
            CallResult::Transient { error, .. } if attempt >= self.max_attempts as i32 => Verdict::Dead {
                error: format!("gave up after {attempt} attempts; last: {error}"),
            },
            CallResult::Transient {
                retry_after, error, ..
            } => Verdict::Retry {
                delay: match retry_after {
                    Some(after) => after.min(self.max),
                    None => self.backoff(attempt),
                },
                error,
            },
        }
    }

    /// Exponential backoff with full jitter: uniform in [0, min(max, base * 2^(attempt-1))].
    /// Full jitter spreads the retries of many rows that failed together
    /// (one downstream outage) instead of sending them back in waves.
    pub fn backoff(&self, attempt: i32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let ms = ceiling.as_millis() as u64;
        Duration::from_millis(rand::rng().random_range(0..=ms))
    }

    /// The upper bound of the jittered delay after `attempt`.
    pub fn ceiling(&self, attempt: i32) -> Duration {
        let exponent = attempt.saturating_sub(1).clamp(0, 30) as u32;
        self.base.saturating_mul(1u32 << exponent).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 5,
            base: Duration::from_millis(100),
            max: Duration::from_secs(2),
        }
    }

    fn transient(retry_after: Option<Duration>, error: &str) -> CallResult {
        CallResult::Transient {
            http_status: Some(503),
            retry_after,
            error: error.into(),
        }
    }

    #[test]
    fn backoff_grows_caps_and_jitters() {
        let p = policy();
        assert_eq!(p.ceiling(1), Duration::from_millis(100));
        assert_eq!(p.ceiling(2), Duration::from_millis(200));
        assert_eq!(p.ceiling(4), Duration::from_millis(800));
        assert_eq!(p.ceiling(6), Duration::from_secs(2));
        assert_eq!(p.ceiling(1000), Duration::from_secs(2));
        let samples: Vec<Duration> = (0..200).map(|_| p.backoff(3)).collect();
        assert!(samples.iter().all(|d| *d <= Duration::from_millis(400)));
        let distinct: std::collections::HashSet<_> = samples.iter().collect();
        assert!(distinct.len() > 20, "full jitter spreads the delays");
    }

    #[test]
    fn verdicts_follow_the_policy() {
        let p = policy();
        assert_eq!(
            p.verdict(1, CallResult::Succeeded { http_status: 201 }),
            Verdict::Done
        );
        assert_eq!(
            p.verdict(
                1,
                CallResult::Permanent {
                    http_status: Some(400),
                    error: "HTTP 400: no".into()
                }
            ),
            Verdict::Dead {
                error: "HTTP 400: no".into()
            }
        );
        // Retry-After is honoured, up to the cap.
        assert_eq!(
            p.verdict(2, transient(Some(Duration::from_secs(1)), "HTTP 429")),
            Verdict::Retry {
                delay: Duration::from_secs(1),
                error: "HTTP 429".into()
            }
        );
        assert_eq!(
            p.verdict(2, transient(Some(Duration::from_secs(99)), "e")),
            Verdict::Retry {
                delay: Duration::from_secs(2),
                error: "e".into()
            }
        );
        // The last allowed attempt failing is dead, with the last error.
        match p.verdict(5, transient(None, "HTTP 503: busy")) {
            Verdict::Dead { error } => assert!(error.contains("5 attempts") && error.contains("HTTP 503")),
            other => panic!("{other:?}"),
        }
    }
}
