//! The relay's Prometheus metrics (docs/CONTRACT.md, section 8). Gauges read from the
//! database are refreshed on an interval by one task, not per scrape.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::storage::{Backlog, Pruned, RowKind, Verdict};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DispatchLabels {
    pub kind: &'static str,
    /// The verdict: done | retry | dead
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// `pruned` (the run had the lock; it may have found nothing to delete),
/// `locked_out` (another replica was pruning), `failed`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PruneResult {
    pub result: &'static str,
}

/// `outbox` or `processed_events`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabel {
    pub table: &'static str,
}

#[derive(Clone)]
pub struct RelayMetrics {
    pub dispatches: Family<DispatchLabels, Counter>,
    pub dispatch_duration: Family<KindLabel, Histogram>,
    pub pending: Gauge,
    pub oldest_pending_age: Gauge<f64, AtomicU64>,
    pub dead: Gauge,
    pub enqueue_to_done: Histogram,
    /// Beyond the documented list: the periodic pruner's runs and what they
    /// deleted, so that retention failing (and tables growing) can alert.
    pub prune_runs: Family<PruneResult, Counter>,
    pub pruned_rows: Family<TableLabel, Counter>,
}

const CALL_BUCKETS: [f64; 14] = [
    0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// From milliseconds (idle relay, NOTIFY) to hours (a downstream outage).
const ENQUEUE_TO_DONE_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 7200.0,
];

impl RelayMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            dispatches: Family::default(),
            dispatch_duration: Family::new_with_constructor(|| Histogram::new(CALL_BUCKETS)),
            pending: Gauge::default(),
            oldest_pending_age: Gauge::default(),
            dead: Gauge::default(),
            enqueue_to_done: Histogram::new(ENQUEUE_TO_DONE_BUCKETS),
            prune_runs: Family::default(),
            pruned_rows: Family::default(),
        };
        // Every series exists from the start, at 0, so that rules comparing
        // them see a value rather than nothing.
        for result in ["pruned", "locked_out", "failed"] {
            let _ = metrics.prune_runs.get_or_create(&PruneResult { result });
        }
        for table in ["outbox", "processed_events"] {
            let _ = metrics.pruned_rows.get_or_create(&TableLabel { table });
        }
        registry.register(
            "outbox_dispatch",
            "Downstream calls by command kind and outcome",
            metrics.dispatches.clone(),
        );
        registry.register(
            "outbox_dispatch_duration_seconds",
            "Downstream call duration by command kind, in seconds",
            metrics.dispatch_duration.clone(),
        );
        registry.register(
            "outbox_pending",
            "Rows pending (due, leased or waiting to retry), counted up to 100000",
            metrics.pending.clone(),
        );
        registry.register(
            "outbox_oldest_pending_age_seconds",
            "Age of the pending row next in line (the earliest due), 0 when none",
            metrics.oldest_pending_age.clone(),
        );
        registry.register(
            "outbox_dead",
            "Rows dead, waiting for an operator",
            metrics.dead.clone(),
        );
        registry.register(
            "outbox_enqueue_to_done_seconds",
            "Time from enqueue (the ingest's commit) to done, in seconds",
            metrics.enqueue_to_done.clone(),
        );
        registry.register(
            "outbox_prune_runs",
            "Runs of the periodic pruner by result (pruned, locked_out, failed)",
            metrics.prune_runs.clone(),
        );
        registry.register(
            "outbox_pruned_rows",
            "Rows deleted by the periodic pruner, by table",
            metrics.pruned_rows.clone(),
        );
        metrics
    }

    /// One run of the periodic pruner: its result, or `None` when it failed.
    pub fn pruned(&self, pruned: Option<&Pruned>) {
        let result = match pruned {
            None => "failed",
            Some(p) if !p.ran => "locked_out",
            Some(p) => {
                for (table, rows) in [
                    ("outbox", p.outbox_rows),
                    ("processed_events", p.processed_events),
                ] {
                    self.pruned_rows.get_or_create(&TableLabel { table }).inc_by(rows);
                }
                "pruned"
            }
        };
        self.prune_runs.get_or_create(&PruneResult { result }).inc();
    }

    /// One recorded call: its row's kind (one this release does not know is
    /// counted as `unknown`), the verdict on it and how long it took.
    pub fn dispatched(&self, kind: &RowKind, verdict: &Verdict, seconds: f64) {
        let kind = kind.label();
        let outcome = verdict.as_str();
        self.dispatches
            .get_or_create(&DispatchLabels { kind, outcome })
            .inc();
        self.dispatch_duration
            .get_or_create(&KindLabel { kind })
            .observe(seconds);
    }

    pub fn set_backlog(&self, backlog: &Backlog) {
        self.pending.set(backlog.pending);
        self.oldest_pending_age.set(backlog.oldest_pending_age_seconds);
        self.dead.set(backlog.dead);
    }
}
