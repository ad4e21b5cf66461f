//! The ingest's Prometheus metrics (docs/CONTRACT.md, section 8).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// The response `status`, or duplicate, invalid_signature, malformed,
    /// too_large, unavailable, internal_error.
    pub outcome: &'static str,
}

#[derive(Clone)]
pub struct IngestMetrics {
    pub requests: Family<OutcomeLabel, Counter>,
    pub duration: Histogram,
    /// Tries of the record statement that found their order locked past the
    /// session's `lock_timeout` (each then waited with no connection).
    pub lock_waits: Counter,
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
        metrics
    }

    pub fn observe(&self, outcome: &'static str, seconds: f64) {
        self.requests.get_or_create(&OutcomeLabel { outcome }).inc();
        self.duration.observe(seconds);
    }
}
