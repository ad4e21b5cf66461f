//! The snapshot behind `GET /stats` and [`super::RunningDownstream::stats`]:
//! one type for both, `Deserialize` too, so a test that runs the binary
//! parses the JSON into the same struct a test in process gets directly.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Everything the downstream saw and did since start (or the last
/// `POST /control/reset`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Requests to `/shipments` and `/emails`, whatever their outcome.
    pub requests: u64,
    /// Effects created: shipments made, emails sent.
    pub effects: u64,
    /// Targets (path, order, template) with more than one effect: the
    /// number the product exists to keep at zero.
    pub double_effects: u64,
    /// Requests answered from a stored response (`Idempotent-Replayed: true`).
    pub replays: u64,
    /// `"/shipments"` and `"/emails"`.
    pub by_path: BTreeMap<String, PathStats>,
    /// Answers by status code (`"201"`, `"500"`, ...), counted when decided
    /// (a hung answer before it is sent); connections dropped without an
    /// answer count under `"reset"`.
    pub status_counts: BTreeMap<String, u64>,
    /// Faults applied, drawn or scripted.
    pub injected: Injected,
    /// The first [`MAX_DOUBLE_TARGETS`] targets with more than one effect.
    pub double_effect_targets: Vec<TargetEffects>,
    /// Every target with an effect, by path, order and template: what a
    /// per-order audit reads (`simulator audit`). Empty with `GET /stats?keys=false`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetEffects>,
    /// Per idempotency key; absent with `GET /stats?keys=false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<BTreeMap<String, KeyStats>>,
}

/// How many doubled targets are listed by name: enough to debug, bounded
/// for a `--no-idempotency` run over 50,000 orders.
pub const MAX_DOUBLE_TARGETS: usize = 100;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathStats {
    pub requests: u64,
    pub effects: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Injected {
    /// 500, 502 and 503 answers (and any other scripted status).
    pub errors: u64,
    /// 429 answers.
    pub rate_limited: u64,
    /// Connections dropped without an answer.
    pub resets: u64,
    /// Answers held back by `hang_ms`.
    pub hangs: u64,
    /// Script entries consumed (each is also counted under its kind above,
    /// except 2xx entries, which are normal processing).
    pub scripted: u64,
}

/// One logical target and how many effects it got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetEffects {
    pub path: String,
    pub order_id: i64,
    /// The email template; `None` for shipments.
    pub template: Option<String>,
    pub effects: u64,
}

/// What one idempotency key saw.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyStats {
    pub requests: u64,
    /// At most 1 unless `--no-idempotency`.
    pub effects: u64,
    /// The first [`MAX_STATUSES`] answers in order; `0` is a reset (no answer).
    pub statuses: Vec<u16>,
    /// The `traceparent` of the first [`MAX_SAMPLES`] requests (`""` when absent).
    pub traceparents: Vec<String>,
    /// The body of the first [`MAX_SAMPLES`] requests (lossy UTF-8).
    pub bodies: Vec<String>,
    /// Unix ms of the first request with this key, whatever its outcome.
    pub first_at_ms: u64,
    /// Unix ms of the latest request with this key.
    pub last_at_ms: u64,
    /// Unix ms when the (first) effect was created; the end of an event's
    /// journey for the latency benchmark.
    pub effect_at_ms: Option<u64>,
    /// The first [`MAX_STATUSES`] calls in arrival order, with when each
    /// started and ended: what an audit needs to tell a call that was under
    /// way at some moment from one that started after it. A call still in
    /// flight has `ended_us` 0 and `status` 0.
    #[serde(default)]
    pub calls: Vec<CallRecord>,
}

/// One request with a key, as the downstream saw it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CallRecord {
    /// Unix microseconds when the request reached the handler.
    pub arrived_us: u64,
    /// Unix microseconds when the handler finished: the answer handed to the server, the
    /// connection reset, or the request dropped because the client went away.
    pub ended_us: u64,
    /// The status answered; 0 for a reset or a request dropped before its answer.
    pub status: u16,
    /// Whether this call created the key's effect.
    pub effect: bool,
    /// Whether the answer was held back by a hang fault (the work done, the answer late).
    pub hung: bool,
}

/// Statuses and calls kept per key: a retry storm shows its shape in 50.
pub const MAX_STATUSES: usize = 50;
/// Traceparents and bodies kept per key: enough to check that retries send
/// the same body and trace, bounded so 50,000 keys stay a few MB.
pub const MAX_SAMPLES: usize = 10;

impl Stats {
    /// The key's stats; panics with the known keys when absent (tests).
    pub fn key(&self, key: &str) -> &KeyStats {
        let keys = self.keys.as_ref().expect("stats taken with keys");
        keys.get(key).unwrap_or_else(|| {
            panic!(
                "no key {key:?} in stats; keys: {:?}",
                keys.keys().collect::<Vec<_>>()
            )
        })
    }

    /// Answers with this status (`"reset"` for dropped connections).
    pub fn status_count(&self, status: &str) -> u64 {
        self.status_counts.get(status).copied().unwrap_or(0)
    }
}
