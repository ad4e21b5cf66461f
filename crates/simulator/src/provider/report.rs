//! What a run hands back: the [`Summary`] (`--json` prints it as one line
//! on stdout, and stderr gets it as a table) and, per event, an
//! [`AckRecord`] (`--ack-file`). Both are `Deserialize` too, so a test that
//! runs the binary parses them into the same types a test in process gets.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The numbers of a run.
///
/// Every delivery attempt is counted once in `deliveries`, and once more in
/// exactly one of `status_counts` (an answer read in full), `timeouts` or
/// `connection_errors`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Events generated.
    pub events: u64,
    /// Events at least one delivery of which got a 2xx.
    pub acknowledged: u64,
    /// Events none of whose deliveries got a 2xx.
    pub failed: u64,
    /// The failed events whose delivery stopped at a 4xx (a bad signature,
    /// a body the ingest refuses): retrying could not help.
    pub permanent_failures: u64,
    /// Delivery attempts, retries included.
    pub deliveries: u64,
    /// Attempts of duplicate deliveries (on time or late), retries included.
    pub duplicate_deliveries: u64,
    /// Attempts of a burst's deliveries other than the event's own,
    /// retries included.
    pub burst_deliveries: u64,
    /// Attempts after the first of their delivery.
    pub retries: u64,
    pub timeouts: u64,
    /// Refused, reset or closed connections (and any other transport error).
    pub connection_errors: u64,
    /// Answers by status code: `{"200": 9870, "503": 12}`.
    pub status_counts: BTreeMap<String, u64>,
    /// Answers with `Idempotent-Replayed: true`.
    pub replayed: u64,
    /// From start to the last event settled (the late phase included).
    pub elapsed_secs: f64,
    /// `deliveries / elapsed_secs`.
    pub deliveries_per_sec: f64,
    /// Of every answered attempt; see [`super::stats`] for what is timed.
    pub latency_ms: LatencyMs,
    /// The ingest's `status` per acknowledged event: `{"processed": 9000, ...}`.
    pub outcomes: BTreeMap<String, u64>,
    /// CPU time (user + system) this process spent during the run, every
    /// thread included; `null` without procfs. The generator's own cost
    /// when it runs as `simulator provider`.
    pub cpu_secs: Option<f64>,
    /// The run's `--run-id`: event ids are `evt_<run_id>_<n>`.
    #[serde(default)]
    pub run_id: String,
    /// The seed of the event mix: `--seed` repeats the run's events.
    #[serde(default)]
    pub seed: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyMs {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    /// Whether the run did its job: every event acknowledged, or with
    /// `allow_failures`, every event acknowledged or refused for good (4xx).
    /// Decides the exit code.
    pub fn success(&self, allow_failures: bool) -> bool {
        let fine = if allow_failures {
            self.acknowledged + self.permanent_failures
        } else {
            self.acknowledged
        };
        fine == self.events
    }

    fn counts(map: &BTreeMap<String, u64>) -> String {
        if map.is_empty() {
            return "-".into();
        }
        map.iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join("  ")
    }
}

/// The short table on stderr at the end of a run.
impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.latency_ms;
        writeln!(
            f,
            "[provider] run {} (seed {}) done in {:.1}s: {} events, {} acknowledged, {} failed ({} permanently)",
            self.run_id,
            self.seed,
            self.elapsed_secs,
            self.events,
            self.acknowledged,
            self.failed,
            self.permanent_failures
        )?;
        writeln!(
            f,
            "  deliveries   {:>9}  ({:.0}/s)  duplicates {}  bursts {}  retries {}  replayed {}",
            self.deliveries,
            self.deliveries_per_sec,
            self.duplicate_deliveries,
            self.burst_deliveries,
            self.retries,
            self.replayed
        )?;
        writeln!(
            f,
            "  no answer    {:>9}  (timeouts {}  connection errors {})",
            self.timeouts + self.connection_errors,
            self.timeouts,
            self.connection_errors
        )?;
        writeln!(f, "  statuses     {}", Self::counts(&self.status_counts))?;
        writeln!(f, "  outcomes     {}", Self::counts(&self.outcomes))?;
        write!(
            f,
            "  latency ms   p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}  mean {:.2}",
            l.p50, l.p90, l.p99, l.p999, l.max, l.mean
        )?;
        if let Some(cpu) = self.cpu_secs {
            write!(f, "\n  cpu          {cpu:.2}s")?;
        }
        Ok(())
    }
}

/// One event, once every delivery of it is over: a line of `--ack-file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckRecord {
    pub event_id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub payment_id: String,
    /// Some delivery got a 2xx: the ingest has the event. `false` means no
    /// 2xx was ever *read*: after a timeout or a dropped connection the
    /// ingest may still have committed the event, unless (as ours does) it
    /// answers 503 on its own deadline, well inside the provider's timeout.
    pub acknowledged: bool,
    /// The ingest's `status` from the first 2xx; `null` if none (or the body
    /// had no `status`).
    pub status: Option<String>,
    /// The acknowledging answer's status if acknowledged, otherwise the last
    /// answer's; `null` if no attempt was ever answered.
    pub http_status: Option<u16>,
    /// Attempts of every delivery of the event (bursts, duplicates, retries).
    pub deliveries: u32,
    /// When the first 2xx was read, in Unix milliseconds: the moment the
    /// provider knows the ingest has the event (the start of an end-to-end
    /// latency); `null` if never acknowledged.
    #[serde(default)]
    pub acknowledged_at_ms: Option<u64>,
}

/// What [`super::run`] returns.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub summary: Summary,
    /// Every event's record in the order they settled, when
    /// [`super::ProviderConfig::keep_records`] is set; empty otherwise.
    pub records: Vec<AckRecord>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_and_the_table() {
        let mut s = Summary {
            events: 3,
            acknowledged: 2,
            failed: 1,
            permanent_failures: 1,
            status_counts: BTreeMap::from([("200".into(), 2), ("401".into(), 1)]),
            cpu_secs: Some(0.5),
            ..Summary::default()
        };
        assert!(!s.success(false));
        assert!(s.success(true));
        s.permanent_failures = 0;
        assert!(!s.success(true));
        let table = s.to_string();
        assert!(table.contains("3 events, 2 acknowledged, 1 failed"), "{table}");
        assert!(table.contains("200: 2  401: 1"), "{table}");
        assert!(table.contains("outcomes     -"), "{table}");
        assert!(table.ends_with("cpu          0.50s"), "{table}");
    }

    #[test]
    fn the_json_shapes() {
        let json = serde_json::to_value(Summary::default()).unwrap();
        for key in [
            "events",
            "acknowledged",
            "failed",
            "deliveries",
            "duplicate_deliveries",
            "burst_deliveries",
            "retries",
            "timeouts",
            "connection_errors",
            "status_counts",
            "replayed",
            "elapsed_secs",
            "deliveries_per_sec",
            "latency_ms",
            "outcomes",
        ] {
            assert!(json.get(key).is_some(), "{key} missing from {json}");
        }
        for key in ["p50", "p90", "p99", "p999", "max", "mean"] {
            assert!(json["latency_ms"].get(key).is_some(), "latency_ms.{key}");
        }
        let record = AckRecord {
            event_id: "evt_1".into(),
            event_type: "payment.succeeded".into(),
            payment_id: "pay_1".into(),
            acknowledged: false,
            status: None,
            http_status: None,
            deliveries: 3,
            acknowledged_at_ms: None,
        };
        assert_eq!(
            serde_json::to_string(&record).unwrap(),
            r#"{"event_id":"evt_1","type":"payment.succeeded","payment_id":"pay_1","acknowledged":false,"status":null,"http_status":null,"deliveries":3,"acknowledged_at_ms":null}"#
        );
    }
}
