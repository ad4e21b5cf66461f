//! The plain counters, and the snapshot `GET /stats` serves.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{Api, State, lock};
use crate::downstream::stats::{Injected, PathStats, Stats, TargetEffects};

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) requests: [AtomicU64; 2],
    pub(super) effects: [AtomicU64; 2],
    pub(super) replays: AtomicU64,
    pub(super) double_effects: AtomicU64,
    /// Indexed by status code.
    pub(super) statuses: Vec<AtomicU64>,
    pub(super) errors: AtomicU64,
    pub(super) rate_limited: AtomicU64,
    pub(super) resets: AtomicU64,
    pub(super) hangs: AtomicU64,
    pub(super) scripted: AtomicU64,
}

impl Counters {
    pub(super) fn new() -> Self {
        Self {
            statuses: (0..600).map(|_| AtomicU64::new(0)).collect(),
            ..Self::default()
        }
    }

    pub(super) fn clear(&self) {
        let all = self
            .requests
            .iter()
            .chain(&self.effects)
            .chain(&self.statuses)
            .chain([
                &self.replays,
                &self.double_effects,
                &self.errors,
                &self.rate_limited,
                &self.resets,
                &self.hangs,
                &self.scripted,
            ]);
        for counter in all {
            counter.store(0, Relaxed);
        }
    }
}

impl State {
    pub(crate) fn snapshot(&self, with_keys: bool) -> Stats {
        let c = &self.counters;
        let by_path = Api::ALL
            .into_iter()
            .map(|api| {
                let stats = PathStats {
                    requests: c.requests[api.index()].load(Relaxed),
                    effects: c.effects[api.index()].load(Relaxed),
                };
                (api.path().to_owned(), stats)
            })
            .collect::<BTreeMap<_, _>>();
        let mut status_counts: BTreeMap<String, u64> = c
            .statuses
            .iter()
            .enumerate()
            .filter_map(|(code, n)| {
                let n = n.load(Relaxed);
                (n > 0).then(|| (code.to_string(), n))
            })
            .collect();
        let resets = c.resets.load(Relaxed);
        if resets > 0 {
            status_counts.insert("reset".to_owned(), resets);
        }
        let double_effect_targets = lock(&self.double_targets)
            .clone()
            .into_iter()
            .map(|target| {
                let effects = self.target_shard(target).get(&target).copied().unwrap_or(0);
                target.effects(effects)
            })
            .collect();
        let mut targets = Vec::new();
        if with_keys {
            for shard in &self.targets {
                let shard = lock(shard);
                targets.extend(shard.iter().map(|(target, effects)| target.effects(*effects)));
            }
            targets.sort_by(|a: &TargetEffects, b| {
                (&a.path, a.order_id, &a.template).cmp(&(&b.path, b.order_id, &b.template))
            });
        }
        let keys = with_keys.then(|| {
            let mut keys = BTreeMap::new();
            for shard in &self.keys {
                for (key, record) in lock(shard).iter() {
                    // A key that only has a script has not been seen yet.
                    if record.stats.requests > 0 {
                        keys.insert(key.clone(), record.stats.clone());
                    }
                }
            }
            keys
        });
        Stats {
            requests: by_path.values().map(|p| p.requests).sum(),
            effects: by_path.values().map(|p| p.effects).sum(),
            double_effects: c.double_effects.load(Relaxed),
            replays: c.replays.load(Relaxed),
            by_path,
            status_counts,
            injected: Injected {
                errors: c.errors.load(Relaxed),
                rate_limited: c.rate_limited.load(Relaxed),
                resets,
                hangs: c.hangs.load(Relaxed),
                scripted: c.scripted.load(Relaxed),
            },
            double_effect_targets,
            targets,
            keys,
        }
    }
}
