//! The console's own metric: its actions by what came of them,
//! `ops_console_actions_total{action, outcome}`, beside the build, pool and
//! process metrics every binary of ours exports. Counted from each action's
//! answer, so no answer escapes it.

use actix_web::http::StatusCode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    /// requeue, requeue-all, discard, replay, discard-event.
    pub action: &'static str,
    /// done (it changed what it was asked to, or showed a dry run), unchanged
    /// (its guard changed nothing, or nothing was there), refused (no
    /// session, another CSRF token, actions off, no reason), failed (the
    /// database did not answer).
    pub outcome: &'static str,
}

#[derive(Clone, Default)]
pub struct ConsoleMetrics {
    actions: Family<ActionLabels, Counter>,
}

impl ConsoleMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "ops_console_actions",
            "The console's actions, by action and what came of them",
            metrics.actions.clone(),
        );
        metrics
    }

    /// Counts the answer to a POST on the route `pattern`, if it is an action.
    pub fn answered(&self, pattern: &str, status: StatusCode) {
        let action = match pattern {
            "/dead/{id}/requeue" => "requeue",
            "/dead/requeue" => "requeue-all",
            "/dead/{id}/discard" => "discard",
            "/events/{id}/replay" => "replay",
            "/events/{id}/discard" => "discard-event",
            _ => return,
        };
        let outcome = match status.as_u16() {
            200..=299 => "done",
            404 | 409 => "unchanged",
            500..=599 => "failed",
            _ => "refused",
        };
        self.actions
            .get_or_create(&ActionLabels { action, outcome })
            .inc();
    }
}
