//! Delivering an event as a provider does: sign, post, read the answer,
//! and on anything but a 2xx or a permanent 4xx, back off and try again,
//! possibly at another target, until acknowledged or out of time.
//!
//! An event may have several *deliveries* (its own, a burst's others, a
//! duplicate); each is a chain of *attempts* with its own retries. The
//! event is settled when its last delivery is over (`TrackedEvent`).
//!
//! # What an answer means
//! - 2xx: acknowledged; the delivery stops.
//! - 4xx except 408 and 429: refused for good (bad signature, a body the
//!   ingest will never accept). A real provider would retry these too, for
//!   days; a load generator that did would only hide the bug, so it stops
//!   and counts a permanent failure.
//! - Everything else (5xx, 408, 429, 3xx, a timeout, a connection error) is
//!   retried: `Retry-After` (in seconds) is a floor under the backoff.

use std::borrow::Cow;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use reqwest::Url;
use reqwest::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use serde::Deserialize;
use signature::{Scheme, Secret};
use tokio_util::sync::CancellationToken;

use super::config::{ProviderConfig, RetryPolicy, endpoint};
use super::plan::Event;
use super::report::AckRecord;
use super::stats::{NoAnswer, Role, Stats};

const WEBHOOK_ID: HeaderName = HeaderName::from_static(signature::HEADER_ID);
const WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static(signature::HEADER_TIMESTAMP);
const WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static(signature::HEADER_SIGNATURE);
const STRIPE_SIGNATURE: HeaderName = HeaderName::from_static(signature::HEADER_STRIPE);
const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
const JSON: HeaderValue = HeaderValue::from_static("application/json");

/// How long an idle connection stays in the pool: under actix-web's default
/// keep-alive of 5 s (the ingest keeps 75 s), so the client closes an idle
/// connection before any server we target does, and no request goes out on
/// a connection the server is closing (a spurious connection error).
/// Reconnecting on loopback after 4 idle seconds costs nothing that shows.
const POOL_IDLE: Duration = Duration::from_secs(4);

/// An event and what its deliveries have learnt so far.
pub(crate) struct TrackedEvent {
    /// The event's number in the run, from 1.
    pub n: u64,
    pub event: Event,
    /// Deliveries not over yet: the last one to end settles the event.
    deliveries_left: AtomicU32,
    attempts: AtomicU32,
    /// The last answer's status code; 0 before any.
    last_http: AtomicU16,
    /// The first 2xx.
    ack: OnceLock<Ack>,
    /// A delivery stopped at a permanent 4xx.
    rejected: AtomicBool,
    /// The order's payment was reported to the planner (once).
    reported_paid: AtomicBool,
}

struct Ack {
    http: u16,
    /// Unix milliseconds when the answer was read.
    at_ms: u64,
    /// The ingest's `status`, if the body had one.
    status: Option<Box<str>>,
}

impl TrackedEvent {
    pub(crate) fn new(n: u64, event: Event, deliveries: u32) -> Self {
        Self {
            n,
            event,
            deliveries_left: AtomicU32::new(deliveries),
            attempts: AtomicU32::new(0),
            last_http: AtomicU16::new(0),
            ack: OnceLock::new(),
            rejected: AtomicBool::new(false),
            reported_paid: AtomicBool::new(false),
        }
    }

    /// One delivery is over; `true` for the last, which settles the event.
    pub(crate) fn delivery_over(&self) -> bool {
        // AcqRel: whoever settles sees everything the other deliveries wrote.
        self.deliveries_left.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// `Some(status)` if acknowledged (`"unparsed"` when the 2xx body had
    /// no `status`).
    pub(crate) fn acknowledged_as(&self) -> Option<&str> {
        self.ack
            .get()
            .map(|ack| ack.status.as_deref().unwrap_or("unparsed"))
    }

    pub(crate) fn rejected(&self) -> bool {
        self.rejected.load(Ordering::Relaxed)
    }

    /// `true` once, for an event whose 2xx said `processed`.
    pub(crate) fn newly_processed(&self) -> bool {
        self.acknowledged_as() == Some("processed") && !self.reported_paid.swap(true, Ordering::Relaxed)
    }

    pub(crate) fn record(&self) -> AckRecord {
        let ack = self.ack.get();
        let last_http = self.last_http.load(Ordering::Relaxed);
        AckRecord {
            event_id: self.event.id.clone(),
            event_type: self.event.kind.type_name().to_owned(),
            payment_id: self.event.payment_id.clone(),
            acknowledged: ack.is_some(),
            status: ack.and_then(|a| a.status.as_deref().map(str::to_owned)),
            http_status: ack.map(|a| a.http).or((last_http != 0).then_some(last_http)),
            deliveries: self.attempts.load(Ordering::Relaxed),
            acknowledged_at_ms: ack.map(|a| a.at_ms),
        }
    }

    fn acknowledge(&self, http: u16, body: &[u8]) {
        // Only the first 2xx is parsed: later ones are replays of it.
        if self.ack.get().is_none() {
            let at_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let _ = self.ack.set(Ack {
                http,
                at_ms,
                status: ingest_status(body),
            });
        }
    }
}

/// The `status` of the ingest's answer.
fn ingest_status(body: &[u8]) -> Option<Box<str>> {
    #[derive(Deserialize)]
    struct Answer<'a> {
        #[serde(borrow)]
        status: Option<Cow<'a, str>>,
    }
    let answer: Answer<'_> = serde_json::from_slice(body).ok()?;
    answer.status.map(Into::into)
}

/// What watches a delivery: where its counts go, and what stops it.
#[derive(Clone, Copy)]
pub(crate) struct Watch<'a> {
    pub stats: &'a Stats,
    pub stop: &'a CancellationToken,
}

/// How a delivery ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeliveryEnd {
    Acknowledged,
    /// A permanent 4xx.
    Rejected,
    /// Out of retries or of time, or the run was stopped.
    GaveUp,
}

/// What one attempt's answer calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Acknowledged,
    Rejected,
    Retry { after: Option<Duration> },
}

fn verdict(status: u16, retry_after: Option<Duration>) -> Verdict {
    match status {
        200..=299 => Verdict::Acknowledged,
        408 | 429 => Verdict::Retry { after: retry_after },
        400..=499 => Verdict::Rejected,
        _ => Verdict::Retry { after: retry_after },
    }
}

/// An answer read in full.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) replayed: bool,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) body: Bytes,
}

/// Posts signed deliveries; one per run, shared by every sender.
pub(crate) struct Sender {
    /// One client, so every delivery shares one keep-alive pool.
    http: reqwest::Client,
    endpoints: Vec<Url>,
    scheme: Scheme,
    secret: Secret,
    timeout: Duration,
    retry: RetryPolicy,
}

impl Sender {
    pub(crate) fn new(config: &ProviderConfig) -> anyhow::Result<Self> {
        // reqwest is built without a default TLS provider (the workspace
        // picks ring once); a second install is refused, harmlessly.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder()
            // Loopback targets named explicitly: an HTTP_PROXY in the
            // environment must not reroute (or slow) the load.
            .no_proxy()
            // A provider posts to the URL it was given and nowhere else.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(config.timeout)
            .tcp_nodelay(true)
            .pool_idle_timeout(POOL_IDLE);
        if let Some(in_flight) = config.max_in_flight() {
            // Keep as many idle connections as can be busy at once: fewer
            // would make a closed loop reconnect all the time.
            builder = builder.pool_max_idle_per_host(in_flight);
        }
        Ok(Self {
            http: builder.build()?,
            endpoints: config.targets.iter().map(endpoint).collect(),
            scheme: config.scheme,
            secret: config.secret.clone(),
            timeout: config.timeout,
            retry: config.retry,
        })
    }

    /// One delivery of `tracked`: attempts until a 2xx, a permanent 4xx,
    /// the retry limit or the give-up time (counted from `due`), or `stop`.
    /// The first attempt goes to target `first_target` (modulo their
    /// number), each retry to the next one.
    pub(crate) async fn deliver(
        &self,
        watch: Watch<'_>,
        tracked: &TrackedEvent,
        role: Role,
        first_target: u64,
        due: Instant,
    ) -> DeliveryEnd {
        let Watch { stats, stop } = watch;
        let give_up_at = due + self.retry.give_up_after;
        let mut due = due;
        let mut retries: u32 = 0;
        loop {
            let remaining = give_up_at.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return DeliveryEnd::GaveUp;
            }
            let target = (first_target + u64::from(retries)) % self.endpoints.len() as u64;
            let endpoint = &self.endpoints[target as usize];
            tracked.attempts.fetch_add(1, Ordering::Relaxed);
            let is_retry = retries > 0;
            // No attempt outlives the delivery's give-up time.
            let retry_after = match self
                .attempt(
                    &tracked.event.webhook_id,
                    &tracked.event.body,
                    endpoint,
                    self.timeout.min(remaining),
                )
                .await
            {
                Ok(answer) => {
                    stats.answered(role, is_retry, answer.status, answer.replayed, due.elapsed());
                    tracked.last_http.store(answer.status, Ordering::Relaxed);
                    match verdict(answer.status, answer.retry_after) {
                        Verdict::Acknowledged => {
                            tracked.acknowledge(answer.status, &answer.body);
                            return DeliveryEnd::Acknowledged;
                        }
                        Verdict::Rejected => {
                            tracked.rejected.store(true, Ordering::Relaxed);
                            return DeliveryEnd::Rejected;
                        }
                        Verdict::Retry { after } => after,
                    }
                }
                Err(why) => {
                    stats.unanswered(role, is_retry, why);
                    None
                }
            };
            if self.retry.max_retries.is_some_and(|max| retries >= max) {
                return DeliveryEnd::GaveUp;
            }
            due = Instant::now() + backoff(&self.retry, retries, retry_after);
            if due >= give_up_at {
                return DeliveryEnd::GaveUp;
            }
            stats.retrying.fetch_add(1, Ordering::Relaxed);
            let stopped = tokio::select! {
                () = tokio::time::sleep_until(due.into()) => false,
                () = stop.cancelled() => true,
            };
            stats.retrying.fetch_sub(1, Ordering::Relaxed);
            if stopped {
                return DeliveryEnd::GaveUp;
            }
            retries += 1;
        }
    }

    /// One signed POST, its answer read in full (which also lets the
    /// connection go back to the pool). The timestamp is taken now, per
    /// attempt, as a provider signs each attempt afresh: a retry minutes
    /// later must still be inside the ingest's tolerance. `webhook_id` is
    /// the Standard Webhooks `webhook-id` (signed content, not the ingest's
    /// dedup key, which is the body's `id`).
    pub(crate) async fn attempt(
        &self,
        webhook_id: &HeaderValue,
        body: &Bytes,
        endpoint: &Url,
        timeout: Duration,
    ) -> Result<Answer, NoAnswer> {
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let request = self
            .http
            .post(endpoint.clone())
            .timeout(timeout)
            .header(CONTENT_TYPE, JSON);
        let request = match self.scheme {
            Scheme::Standard => {
                let id = webhook_id.to_str().expect("webhook ids are ASCII");
                let signed = signature::sign_standard(&self.secret, id, timestamp, body);
                request
                    .header(WEBHOOK_ID, webhook_id.clone())
                    .header(WEBHOOK_TIMESTAMP, timestamp)
                    .header(WEBHOOK_SIGNATURE, signed)
            }
            Scheme::Stripe => request.header(
                STRIPE_SIGNATURE,
                signature::sign_stripe(&self.secret, timestamp, body),
            ),
        };
        let response = request
            .body(body.clone())
            .send()
            .await
            .map_err(|e| no_answer(&e))?;
        let status = response.status().as_u16();
        let headers = response.headers();
        let replayed = headers
            .get(IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        let retry_after = headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = response.bytes().await.map_err(|e| no_answer(&e))?;
        Ok(Answer {
            status,
            replayed,
            retry_after,
            body,
        })
    }
}

fn no_answer(err: &reqwest::Error) -> NoAnswer {
    if err.is_timeout() {
        NoAnswer::Timeout
    } else {
        NoAnswer::Connection
    }
}

/// The wait before retry number `retries + 1`: "full jitter", uniform
/// between zero and `min(max, base * 2^retries)`, and at least the answer's
/// `Retry-After`.
///
/// Full jitter rather than a plain exponential: when the ingest blips (the
/// database restarts, a deadline passes), thousands of deliveries fail
/// within the same few milliseconds. Exact exponential waits would bring
/// them back in the same few milliseconds, wave after wave, each one a
/// fresh overload; drawing each wait from the whole window spreads them
/// evenly over it, which finishes the backlog soonest with the least extra
/// load (the comparison in the AWS Architecture Blog's "Exponential backoff
/// and jitter"). The relay backs off the same way.
pub(crate) fn backoff(policy: &RetryPolicy, retries: u32, retry_after: Option<Duration>) -> Duration {
    let ceiling = policy
        .base
        .saturating_mul(2u32.saturating_pow(retries))
        .min(policy.max);
    let ceiling_us = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
    let jitter = Duration::from_micros(rand::random_range(0..=ceiling_us));
    retry_after.map_or(jitter, |after| after.max(jitter))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_full_jitter_under_a_doubling_capped_ceiling() {
        let policy = RetryPolicy {
            base: Duration::from_millis(100),
            max: Duration::from_millis(1000),
            ..RetryPolicy::default()
        };
        for (retries, ceiling_ms) in [(0, 100), (1, 200), (3, 800), (4, 1000), (40, 1000)] {
            let waits: Vec<_> = (0..2000).map(|_| backoff(&policy, retries, None)).collect();
            let max = waits.iter().max().unwrap().as_millis();
            let min = waits.iter().min().unwrap().as_millis();
            assert!(max <= ceiling_ms, "retry {retries}: {max} > {ceiling_ms}");
            // Spread over the whole window, not bunched at its top.
            assert!(
                max * 10 >= ceiling_ms * 9 && min * 10 <= ceiling_ms,
                "{min}..{max}"
            );
        }
        for _ in 0..100 {
            let wait = backoff(&policy, 0, Some(Duration::from_secs(2)));
            assert_eq!(wait, Duration::from_secs(2), "Retry-After is a floor");
        }
    }

    #[test]
    fn what_answers_mean() {
        assert_eq!(verdict(200, None), Verdict::Acknowledged);
        assert_eq!(verdict(204, None), Verdict::Acknowledged);
        for permanent in [400, 401, 404, 413, 422] {
            assert_eq!(verdict(permanent, None), Verdict::Rejected, "{permanent}");
        }
        let after = Some(Duration::from_secs(1));
        for transient in [408, 429, 500, 502, 503, 301] {
            assert_eq!(verdict(transient, after), Verdict::Retry { after }, "{transient}");
        }
    }

    #[test]
    fn the_ingest_status_is_read_from_the_body() {
        let body = br#"{"event_id":"evt_1","status":"already_paid","order_id":3}"#;
        assert_eq!(ingest_status(body).as_deref(), Some("already_paid"));
        assert_eq!(ingest_status(br#"{"status":"a\"b"}"#).as_deref(), Some("a\"b"));
        assert_eq!(ingest_status(b"{}"), None);
        assert_eq!(ingest_status(b"not json"), None);
    }
}
