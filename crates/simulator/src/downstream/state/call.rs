//! A key's record, and the values a request's handler holds: what to do
//! with it, and the guards that close its call record and free its claimed
//! key whichever way the handler ends.

use std::collections::VecDeque;

use actix_web::http::StatusCode;
use bytes::Bytes;

use super::{State, Stored, Target, unix_us};
use crate::downstream::faults::{Failure, ScriptStep};
use crate::downstream::stats::{CallRecord, KeyStats, MAX_SAMPLES, MAX_STATUSES};

/// Where a key stands.
#[derive(Debug, Default)]
pub(super) enum Claim {
    /// Never succeeded (or only failed): the next request may create the effect.
    #[default]
    Free,
    /// A request is creating the effect right now.
    InProgress { body_hash: u64 },
    /// The effect exists; same body replays, another body is refused.
    Done { body_hash: u64, response: Stored },
}

#[derive(Debug)]
pub(super) struct KeyRecord {
    /// Unique for the process's life: a `POST /control/reset` drops records,
    /// and a call that arrived before it must not close a call of the key's
    /// next record (see [`CallSlot`]).
    pub(super) id: u64,
    pub(super) claim: Claim,
    pub(super) script: VecDeque<ScriptStep>,
    pub(super) stats: KeyStats,
}

/// Where a call's [`CallRecord`] is: its key's record and its index there.
/// `None` past [`MAX_STATUSES`] calls, when nothing is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CallSlot {
    pub(super) record: u64,
    pub(super) index: usize,
}

impl KeyRecord {
    pub(super) fn call_mut(&mut self, slot: CallSlot) -> Option<&mut CallRecord> {
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
    pub(super) state: &'a State,
    pub(super) key: &'a str,
    pub(super) slot: Option<CallSlot>,
    pub(super) status: u16,
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
    pub(super) state: &'a State,
    pub(super) key: &'a str,
    pub(super) body_hash: u64,
    pub(super) target: Target,
    pub(super) call: Option<CallSlot>,
    pub(super) created: bool,
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

impl KeyStats {
    pub(super) fn note_request(&mut self, traceparent: Option<&str>, body: &[u8], at_ms: u64) {
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

    pub(super) fn note_status(&mut self, status: u16) {
        if self.statuses.len() < MAX_STATUSES {
            self.statuses.push(status);
        }
    }
}
