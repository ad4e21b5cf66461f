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

use std::collections::hash_map::{DefaultHasher, RandomState};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use actix_web::http::StatusCode;
use bytes::Bytes;
use serde::Deserialize;

use super::faults::{Failure, Faults, ScriptStep, Step};
use super::stats::{
    CallRecord, Injected, KeyStats, MAX_DOUBLE_TARGETS, MAX_SAMPLES, MAX_STATUSES, PathStats, Stats,
    TargetEffects,
};

/// Shards of the key and target maps: well above the number of workers, so
/// contention is rare, and small enough that a stats snapshot is cheap.
const SHARDS: usize = 64;

/// The two simulated APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Api {
    Shipments,
    Emails,
}

impl Api {
    const ALL: [Api; 2] = [Api::Shipments, Api::Emails];

    pub(crate) fn path(self) -> &'static str {
        match self {
            Self::Shipments => "/shipments",
            Self::Emails => "/emails",
        }
    }

    /// The status of a request that created its effect: the fulfilment API
    /// made the shipment (201), the email API accepted the email for sending (202).
    pub(crate) fn success(self) -> StatusCode {
        match self {
            Self::Shipments => StatusCode::CREATED,
            Self::Emails => StatusCode::ACCEPTED,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Template {
    OrderConfirmation,
    RefundNotice,
}

impl Template {
    fn as_str(self) -> &'static str {
        match self {
            Self::OrderConfirmation => "order_confirmation",
            Self::RefundNotice => "refund_notice",
        }
    }
}

/// What an effect is about: one shipment per order, one email per order and
/// template. More than one effect on a target is a double effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Target {
    Shipment { order_id: i64 },
    Email { order_id: i64, template: Template },
}

impl Target {
    fn api(self) -> Api {
        match self {
            Self::Shipment { .. } => Api::Shipments,
            Self::Email { .. } => Api::Emails,
        }
    }

    fn effects(self, effects: u64) -> TargetEffects {
        let (order_id, template) = match self {
            Self::Shipment { order_id } => (order_id, None),
            Self::Email { order_id, template } => (order_id, Some(template.as_str().to_owned())),
        };
        TargetEffects {
            path: self.api().path().to_owned(),
            order_id,
            template,
            effects,
        }
    }
}

/// A response kept for replay: the status and the exact body bytes.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub status: StatusCode,
    pub body: Bytes,
}

/// Where a key stands.
#[derive(Debug, Default)]
enum Claim {
    /// Never succeeded (or only failed): the next request may create the effect.
    #[default]
    Free,
    /// A request is creating the effect right now.
    InProgress { body_hash: u64 },
    /// The effect exists; same body replays, another body is refused.
    Done { body_hash: u64, response: Stored },
}

#[derive(Debug)]
struct KeyRecord {
    /// Unique for the process's life: a `POST /control/reset` drops records,
    /// and a call that arrived before it must not close a call of the key's
    /// next record (see [`CallSlot`]).
    id: u64,
    claim: Claim,
    script: VecDeque<ScriptStep>,
    stats: KeyStats,
}

/// Where a call's [`CallRecord`] is: its key's record and its index there.
/// `None` past [`MAX_STATUSES`] calls, when nothing is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CallSlot {
    record: u64,
    index: usize,
}

impl KeyRecord {
    fn call_mut(&mut self, slot: CallSlot) -> Option<&mut CallRecord> {
        (self.id == slot.record)
            .then(|| self.stats.calls.get_mut(slot.index))
            .flatten()
    }
}

/// What to do with a request, decided on arrival under its key's lock.
pub(crate) enum Verdict<'a> {
    /// Create the effect (the key, if keys are honoured, is claimed until then).
    Create(PendingEffect<'a>),
    Replay(Stored),
    /// Another request with this key is creating the effect: 409.
    Busy,
    /// The key was used with another body: 422.
    Mismatch,
    Fail(Failure),
}

/// One valid request, as far as the memory is concerned.
pub(crate) struct Arrival<'a> {
    pub key: &'a str,
    pub target: Target,
    pub body: &'a [u8],
    pub traceparent: Option<&'a str>,
    /// Unix microseconds when the request reached the handler.
    pub at_us: u64,
}

/// A request's fate, decided on arrival: what to answer, whether the answer
/// is held back by a hang, and its open call record.
pub(crate) struct Decision<'a> {
    pub verdict: Verdict<'a>,
    pub hang: bool,
    pub call: CallEnd<'a>,
}

/// Closes a call's [`CallRecord`] when dropped, whichever way the handler
/// ends: with the status given to [`CallEnd::answered`], or 0 when it never
/// was (a reset, or the future dropped because the client went away).
pub(crate) struct CallEnd<'a> {
    state: &'a State,
    key: &'a str,
    slot: Option<CallSlot>,
    status: u16,
}

impl CallEnd<'_> {
    /// The answer about to be handed to the server.
    pub(crate) fn answered(&mut self, status: StatusCode) {
        self.status = status.as_u16();
    }
}

impl Drop for CallEnd<'_> {
    fn drop(&mut self) {
        let Some(slot) = self.slot else { return };
        let ended_us = unix_us();
        let mut shard = self.state.key_shard(self.key);
        if let Some(call) = shard.get_mut(self.key).and_then(|record| record.call_mut(slot)) {
            call.ended_us = ended_us;
            call.status = self.status;
        }
    }
}

/// A claimed key whose effect is yet to be created. Dropped without
/// [`PendingEffect::create`] (the request was cancelled), it frees the key
/// so a retry can succeed: no effect, nothing stored.
pub(crate) struct PendingEffect<'a> {
    state: &'a State,
    key: &'a str,
    body_hash: u64,
    target: Target,
    call: Option<CallSlot>,
    created: bool,
}

impl PendingEffect<'_> {
    /// Creates the effect and stores the response; returns its body.
    pub(crate) fn create(mut self) -> Bytes {
        self.created = true;
        self.state
            .create_effect(self.key, self.body_hash, self.target, self.call)
    }
}

impl Drop for PendingEffect<'_> {
    fn drop(&mut self) {
        if !self.created && self.state.idempotency {
            let mut shard = self.state.key_shard(self.key);
            if let Some(record) = shard.get_mut(self.key)
                && matches!(record.claim, Claim::InProgress { .. })
            {
                record.claim = Claim::Free;
            }
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    requests: [AtomicU64; 2],
    effects: [AtomicU64; 2],
    replays: AtomicU64,
    double_effects: AtomicU64,
    /// Indexed by status code.
    statuses: Vec<AtomicU64>,
    errors: AtomicU64,
    rate_limited: AtomicU64,
    resets: AtomicU64,
    hangs: AtomicU64,
    scripted: AtomicU64,
}

impl Counters {
    fn new() -> Self {
        Self {
            statuses: (0..600).map(|_| AtomicU64::new(0)).collect(),
            ..Self::default()
        }
    }

    fn clear(&self) {
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

impl KeyStats {
    fn note_request(&mut self, traceparent: Option<&str>, body: &[u8], at_ms: u64) {
        if self.requests == 0 {
            self.first_at_ms = at_ms;
        }
        self.requests += 1;
        self.last_at_ms = at_ms;
        if self.traceparents.len() < MAX_SAMPLES {
            self.traceparents.push(traceparent.unwrap_or_default().to_owned());
        }
        if self.bodies.len() < MAX_SAMPLES {
            self.bodies.push(String::from_utf8_lossy(body).into_owned());
        }
    }

    fn note_status(&mut self, status: u16) {
        if self.statuses.len() < MAX_STATUSES {
            self.statuses.push(status);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn arrive<'a>(state: &'a State, key: &'a str, body: &'a [u8], step: Step) -> Decision<'a> {
        let arrival = Arrival {
            key,
            target: Target::Shipment { order_id: 1 },
            body,
            traceparent: None,
            at_us: unix_us(),
        };
        state.decide(&arrival, step)
    }

    fn calls(state: &State, key: &str) -> Vec<CallRecord> {
        state.snapshot(true).key(key).calls.clone()
    }

    #[test]
    fn a_call_dropped_after_its_effect_records_the_effect_and_no_answer() {
        let state = State::new(true, Faults::default());
        let body = br#"{"order_id":1}"#;
        let Decision { verdict, hang, call } = arrive(&state, "ship-1", body, Step::Hang);
        assert!(hang);
        let Verdict::Create(pending) = verdict else {
            panic!("a free key is claimed")
        };
        pending.create();
        let open = calls(&state, "ship-1");
        assert_eq!((open[0].ended_us, open[0].effect, open[0].hung), (0, true, true));

        // The handler's future dropped mid-hang: no `answered`.
        drop(call);
        let closed = &calls(&state, "ship-1")[0];
        assert!(closed.ended_us >= closed.arrived_us && closed.ended_us > 0);
        assert_eq!((closed.status, closed.effect, closed.hung), (0, true, true));
    }

    #[test]
    fn a_call_from_before_a_reset_leaves_the_keys_new_calls_alone() {
        let state = State::new(true, Faults::default());
        let body = br#"{"order_id":1}"#;
        let before = arrive(&state, "ship-1", body, Step::Proceed);
        state.reset();
        let Decision {
            verdict, mut call, ..
        } = arrive(&state, "ship-1", body, Step::Proceed);
        let Verdict::Create(pending) = verdict else {
            panic!("the reset freed the key")
        };

        // Both calls sit at index 0 of their key's record; only the new one
        // may close the new record's call.
        drop(before);
        assert_eq!(calls(&state, "ship-1")[0].ended_us, 0);
        pending.create();
        call.answered(StatusCode::CREATED);
        drop(call);
        let after = calls(&state, "ship-1");
        assert_eq!(after.len(), 1);
        assert_eq!((after[0].status, after[0].effect), (201, true));
    }

    #[test]
    fn past_max_statuses_calls_are_not_recorded() {
        let state = State::new(true, Faults::default());
        for _ in 0..MAX_STATUSES + 3 {
            let mut decision = arrive(&state, "ship-1", b"{}", Step::Fail(Failure::Reset));
            decision.call.answered(StatusCode::OK);
        }
        let recorded = calls(&state, "ship-1");
        assert_eq!(recorded.len(), MAX_STATUSES);
        assert!(recorded.iter().all(|c| c.status == 200 && c.ended_us > 0));
    }
}
