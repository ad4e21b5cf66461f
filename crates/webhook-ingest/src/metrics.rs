//! The ingest's Prometheus metrics (docs/CONTRACT.md, section 8).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// The response `status`, or duplicate, invalid_signature, malformed,
    /// too_large, unavailable, shed, internal_error.
    pub outcome: &'static str,
}

#[derive(Clone)]
pub struct IngestMetrics {
    pub requests: Family<OutcomeLabel, Counter>,
    pub duration: Histogram,
    /// Tries of the record statement that found their order locked past the
    /// session's `lock_timeout` (each then waited with no connection).
    pub lock_waits: Counter,
    /// Statements that recorded several deliveries (crate::batch).
    pub batches: Counter,
    /// Deliveries those statements carried.
    pub batched: Counter,
    /// Deliveries a batch left alone, their order locked by someone else.
    pub batch_contended: Counter,
    /// Batches that failed and wrote nothing (each delivery then alone).
    pub batch_failures: Counter,
    /// Unmatched events the reconciler applied once their order existed.
    pub unmatched_applied: Counter,
    /// Seconds since the first delivery of the oldest event still unmatched
    /// (0 when there is none).
    pub unmatched_oldest_age: Gauge<f64, AtomicU64>,
    /// Unmatched events first delivered before the retry horizon: no longer
    /// applied by themselves, waiting for an operator.
    pub unmatched_past_horizon: Gauge,
}

/// Buckets from 0.5 ms to the longest deadline worth having: the interesting
/// part is the low milliseconds, the tail shows a struggling database.
const DURATION_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.5, 5.0,
];

impl IngestMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            requests: Family::default(),
            duration: Histogram::new(DURATION_BUCKETS),
            lock_waits: Counter::default(),
            batches: Counter::default(),
            batched: Counter::default(),
            batch_contended: Counter::default(),
            batch_failures: Counter::default(),
            unmatched_applied: Counter::default(),
            unmatched_oldest_age: Gauge::default(),
            unmatched_past_horizon: Gauge::default(),
        };
        registry.register(
            "webhook_requests",
            "Webhook deliveries by outcome",
            metrics.requests.clone(),
        );
        registry.register(
            "webhook_request_duration_seconds",
            "Time from the request's arrival to the response, in seconds",
            metrics.duration.clone(),
        );
        registry.register(
            "webhook_order_lock_waits",
            "Tries that found their order locked for longer than lock_timeout, and waited with no connection",
            metrics.lock_waits.clone(),
        );
        registry.register(
            "webhook_record_batches",
            "Statements that recorded several deliveries at once",
            metrics.batches.clone(),
        );
        registry.register(
            "webhook_record_batched_deliveries",
            "Deliveries recorded by statements that recorded several at once",
            metrics.batched.clone(),
        );
        registry.register(
            "webhook_record_batch_contended",
            "Deliveries a batch left to be recorded on their own, their order locked by another transaction",
            metrics.batch_contended.clone(),
        );
        registry.register(
            "webhook_record_batch_failures",
            "Batches that failed and wrote nothing; each of their deliveries was then recorded on its own",
            metrics.batch_failures.clone(),
        );
        registry.register(
            "webhook_unmatched_applied",
            "Events recorded unmatched that were applied by themselves once their order existed",
            metrics.unmatched_applied.clone(),
        );
        registry.register(
            "webhook_unmatched_oldest_age_seconds",
            "Seconds since the first delivery of the oldest event still unmatched (0 when none is)",
            metrics.unmatched_oldest_age.clone(),
        );
        registry.register(
            "webhook_unmatched_past_horizon_events",
            "Events still unmatched past UNMATCHED_HORIZON_HOURS: no longer applied by themselves (counted up to 10000)",
            metrics.unmatched_past_horizon.clone(),
        );
        metrics
    }

    pub fn observe(&self, outcome: &'static str, seconds: f64) {
        self.requests.get_or_create(&OutcomeLabel { outcome }).inc();
        self.duration.observe(seconds);
    }
}
