//! A call's record closed whichever way its handler ends, and kept apart
//! from a reset's new records.

use actix_web::http::StatusCode;

use super::*;
use crate::downstream::faults::{Failure, Faults, Step};
use crate::downstream::stats::{CallRecord, MAX_STATUSES};

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
