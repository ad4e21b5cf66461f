//! The downstream's memory: idempotency keys with their stored responses,
//! effects per logical target, counters, the fault settings.
//!
//! Keys and targets live in [`SHARDS`] maps, each behind its own mutex and
//! picked by hash, so two workers rarely wait for each other and no lock is
//! held across an `.await`. Plain counters are atomics. A request takes the
//! lock of its key's shard once on arrival (record it, consume a script
//! entry, claim the key, open its [`CallRecord`]), if it creates an effect,
//! its target's shard and its key's shard once more to store the response,
//! and its key's shard once more when it ends, to close its call record.
//!
//! # Layout
//! - here: [`State`], deciding a request's fate and creating its effect.
//! - `target`: the two APIs and what an effect is about.
//! - `call`: a key's record, and the guards that close a call and free a
//!   claimed key whichever way the handler ends.
//! - `counters`: the plain counters and the `GET /stats` snapshot.

mod call;
mod counters;
mod target;
#[cfg(test)]
mod tests;

use std::collections::hash_map::{DefaultHasher, RandomState};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use actix_web::http::StatusCode;
use bytes::Bytes;

use super::faults::{Failure, Faults, ScriptStep, Step};
use super::stats::{CallRecord, KeyStats, MAX_DOUBLE_TARGETS, MAX_STATUSES};
use call::{CallSlot, Claim, KeyRecord};
use counters::Counters;

pub(crate) use call::{Arrival, CallEnd, Decision, PendingEffect, Verdict};
pub(crate) use target::{Api, Stored, Target, Template};

/// Shards of the key and target maps: well above the number of workers, so
/// contention is rare, and small enough that a stats snapshot is cheap.
const SHARDS: usize = 64;

/// Shared by every worker.
#[derive(Debug)]
pub(crate) struct State {
    idempotency: bool,
    /// Replaced whole by `POST /control/faults`; readers clone the `Arc`.
    faults: RwLock<Arc<Faults>>,
    keys: Vec<Mutex<HashMap<String, KeyRecord>>>,
    targets: Vec<Mutex<HashMap<Target, u64>>>,
    /// The first doubled targets, in the order they doubled.
    double_targets: Mutex<Vec<Target>>,
    shard_hasher: RandomState,
    counters: Counters,
    /// Per API. Never reset, so one process never hands out an id twice.
    next_id: [AtomicU64; 2],
    /// The last [`KeyRecord::id`] handed out.
    last_record: AtomicU64,
}

/// A poisoned lock only means another request panicked mid-update; the
/// counters stay usable for a simulator.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn unix_ms() -> u64 {
    unix_us() / 1000
}

/// Identifies a body for "same key, same body": SipHash with fixed keys,
/// over the exact bytes (a relay must resend byte for byte).
fn body_hash(body: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    hasher.write(body);
    hasher.finish()
}

impl State {
    pub(crate) fn new(idempotency: bool, faults: Faults) -> Self {
        Self {
            idempotency,
            faults: RwLock::new(Arc::new(faults)),
            keys: (0..SHARDS).map(|_| Mutex::default()).collect(),
            targets: (0..SHARDS).map(|_| Mutex::default()).collect(),
            double_targets: Mutex::default(),
            shard_hasher: RandomState::new(),
            counters: Counters::new(),
            next_id: [AtomicU64::new(0), AtomicU64::new(0)],
            last_record: AtomicU64::new(0),
        }
    }

    fn new_record(&self) -> KeyRecord {
        KeyRecord {
            id: self.last_record.fetch_add(1, Relaxed) + 1,
            claim: Claim::Free,
            script: VecDeque::new(),
            stats: KeyStats::default(),
        }
    }

    fn key_shard(&self, key: &str) -> MutexGuard<'_, HashMap<String, KeyRecord>> {
        lock(&self.keys[self.shard_hasher.hash_one(key) as usize % SHARDS])
    }

    fn target_shard(&self, target: Target) -> MutexGuard<'_, HashMap<Target, u64>> {
        lock(&self.targets[self.shard_hasher.hash_one(target) as usize % SHARDS])
    }

    pub(crate) fn faults(&self) -> Arc<Faults> {
        self.faults.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub(crate) fn set_faults(&self, faults: Faults) {
        *self.faults.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(faults);
    }

    /// Replaces the key's script.
    pub(crate) fn set_script(&self, key: &str, steps: Vec<ScriptStep>) {
        self.key_shard(key)
            .entry(key.to_owned())
            .or_insert_with(|| self.new_record())
            .script = steps.into();
    }

    pub(crate) fn count_request(&self, api: Api) {
        self.counters.requests[api.index()].fetch_add(1, Relaxed);
    }

    fn count_status(&self, status: u16) {
        if let Some(counter) = self.counters.statuses.get(usize::from(status)) {
            counter.fetch_add(1, Relaxed);
        }
    }

    /// A request refused before any idempotency logic (400): counted, and
    /// recorded under its key when it has one, its call ended as it arrived.
    pub(crate) fn note_rejected(
        &self,
        key: Option<&str>,
        traceparent: Option<&str>,
        body: &[u8],
        at_us: u64,
        status: StatusCode,
    ) {
        self.count_status(status.as_u16());
        if let Some(key) = key {
            let mut shard = self.key_shard(key);
            let stats = &mut shard
                .entry(key.to_owned())
                .or_insert_with(|| self.new_record())
                .stats;
            stats.note_request(traceparent, body, at_us / 1000);
            stats.note_status(status.as_u16());
            if stats.calls.len() < MAX_STATUSES {
                stats.calls.push(CallRecord {
                    arrived_us: at_us,
                    ended_us: unix_us(),
                    status: status.as_u16(),
                    effect: false,
                    hung: false,
                });
            }
        }
    }

    /// Records the request and decides its fate: the key's next script entry
    /// if it has one, else `drawn`; then, for a request to process, the
    /// key's state (claim it, replay, 409 or 422). Opens the call's record,
    /// closed when the returned [`CallEnd`] is dropped.
    pub(crate) fn decide<'a>(&'a self, arrival: &Arrival<'a>, drawn: Step) -> Decision<'a> {
        let key = arrival.key;
        let body_hash = body_hash(arrival.body);
        let mut shard = self.key_shard(key);
        if !shard.contains_key(key) {
            shard.insert(key.to_owned(), self.new_record());
        }
        let record = shard.get_mut(key).expect("inserted above");
        record
            .stats
            .note_request(arrival.traceparent, arrival.body, arrival.at_us / 1000);
        let call = (record.stats.calls.len() < MAX_STATUSES).then_some(CallSlot {
            record: record.id,
            index: record.stats.calls.len(),
        });
        let step = match record.script.pop_front() {
            Some(scripted) => {
                self.counters.scripted.fetch_add(1, Relaxed);
                scripted.step()
            }
            None => drawn,
        };
        let verdict = match step {
            Step::Fail(failure) => Verdict::Fail(failure),
            Step::Proceed | Step::Hang if !self.idempotency => {
                Verdict::Create(self.pending(arrival, body_hash, call))
            }
            Step::Proceed | Step::Hang => match &record.claim {
                Claim::Free => {
                    record.claim = Claim::InProgress { body_hash };
                    Verdict::Create(self.pending(arrival, body_hash, call))
                }
                Claim::InProgress { body_hash: h } | Claim::Done { body_hash: h, .. } if *h != body_hash => {
                    Verdict::Mismatch
                }
                Claim::InProgress { .. } => Verdict::Busy,
                Claim::Done { response, .. } => Verdict::Replay(response.clone()),
            },
        };
        let status = match &verdict {
            Verdict::Create(_) => arrival.target.api().success().as_u16(),
            Verdict::Replay(stored) => stored.status.as_u16(),
            Verdict::Busy => StatusCode::CONFLICT.as_u16(),
            Verdict::Mismatch => StatusCode::UNPROCESSABLE_ENTITY.as_u16(),
            Verdict::Fail(Failure::Status(status)) => status.as_u16(),
            Verdict::Fail(Failure::Reset) => 0,
        };
        record.stats.note_status(status);
        let hang = step == Step::Hang;
        if call.is_some() {
            record.stats.calls.push(CallRecord {
                arrived_us: arrival.at_us,
                ended_us: 0,
                status: 0,
                effect: false,
                hung: hang,
            });
        }
        drop(shard);

        let counters = &self.counters;
        let counter = match &verdict {
            Verdict::Replay(_) => Some(&counters.replays),
            Verdict::Fail(Failure::Reset) => Some(&counters.resets),
            Verdict::Fail(Failure::Status(StatusCode::TOO_MANY_REQUESTS)) => Some(&counters.rate_limited),
            Verdict::Fail(Failure::Status(_)) => Some(&counters.errors),
            Verdict::Create(_) | Verdict::Busy | Verdict::Mismatch => None,
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, Relaxed);
        }
        if status != 0 {
            self.count_status(status);
        }
        if hang {
            counters.hangs.fetch_add(1, Relaxed);
        }
        Decision {
            verdict,
            hang,
            call: CallEnd {
                state: self,
                key,
                slot: call,
                status: 0,
            },
        }
    }

    fn pending<'a>(
        &'a self,
        arrival: &Arrival<'a>,
        body_hash: u64,
        call: Option<CallSlot>,
    ) -> PendingEffect<'a> {
        PendingEffect {
            state: self,
            key: arrival.key,
            body_hash,
            target: arrival.target,
            call,
            created: false,
        }
    }

    fn create_effect(&self, key: &str, body_hash: u64, target: Target, call: Option<CallSlot>) -> Bytes {
        let api = target.api();
        let id = self.next_id[api.index()].fetch_add(1, Relaxed) + 1;
        let body = Bytes::from(match target {
            Target::Shipment { order_id } => {
                format!(r#"{{"shipment_id":"SHP-{id:06}","order_id":{order_id}}}"#)
            }
            Target::Email { order_id, template } => format!(
                r#"{{"email_id":"EML-{id:06}","order_id":{order_id},"template":"{}"}}"#,
                template.as_str()
            ),
        });
        self.counters.effects[api.index()].fetch_add(1, Relaxed);

        let effects_on_target = {
            let mut targets = self.target_shard(target);
            let count = targets.entry(target).or_insert(0);
            *count += 1;
            *count
        };
        if effects_on_target == 2 {
            self.counters.double_effects.fetch_add(1, Relaxed);
            let mut doubled = lock(&self.double_targets);
            if doubled.len() < MAX_DOUBLE_TARGETS {
                doubled.push(target);
            }
        }

        let mut shard = self.key_shard(key);
        // A `POST /control/reset` in between forgot the key: record it anew.
        let record = shard.entry(key.to_owned()).or_insert_with(|| self.new_record());
        record.stats.effects += 1;
        record.stats.effect_at_ms.get_or_insert_with(unix_ms);
        if let Some(call) = call.and_then(|slot| record.call_mut(slot)) {
            call.effect = true;
        }
        if self.idempotency {
            record.claim = Claim::Done {
                body_hash,
                response: Stored {
                    status: api.success(),
                    body: body.clone(),
                },
            };
        }
        body
    }

    /// Forgets keys, scripts, effects and counters; keeps the faults and
    /// the id sequences.
    pub(crate) fn reset(&self) {
        for shard in &self.keys {
            lock(shard).clear();
        }
        for shard in &self.targets {
            lock(shard).clear();
        }
        lock(&self.double_targets).clear();
        self.counters.clear();
    }
}
