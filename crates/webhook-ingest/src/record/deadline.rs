//! `INGEST_DEADLINE_MS`, the one bound on a delivery's handling, and the
//! bounds of its parts, each derived from it.

use std::time::Duration;

/// The whole of a delivery's handling, body read and database included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(Duration);

impl Deadline {
    pub fn new(whole: Duration) -> Self {
        Self(whole)
    }

    /// The deadline itself: a statement abandoned at it is waited for as long
    /// again, and the server's `statement_timeout` (its own bound on a
    /// statement whose cancel was lost) is this.
    pub fn whole(self) -> Duration {
        self.0
    }

    /// How long a request's body may take to arrive, from the request's
    /// first byte: half the deadline. A provider sends a webhook's few
    /// kilobytes in one go; a client that needs longer is answered 503
    /// (retry) and keeps the other half from being spent on its database work.
    pub fn body_bound(self) -> Duration {
        self.0 / 2
    }

    /// The longest one try of the record statement waits for its order's
    /// row lock on a connection (`lock_timeout`): a twentieth of the
    /// deadline, between 10 and 100 ms. Longer than the lock a concurrent
    /// event of the same order holds (its one statement and commit), far
    /// shorter than the deadline: a delivery whose order someone holds
    /// locked for long waits between tries with no connection, so a lock on
    /// one order never ties up the pool that other orders need.
    pub fn lock_wait(self) -> Duration {
        self.twentieth()
    }

    /// How long past the deadline the 503 waits for a cancelled statement to
    /// end: as long as a lock wait. On a reachable server a cancel takes a
    /// connection and a round trip, a millisecond or two, so the answer
    /// normally leaves once the statement has ended (rolled back, or
    /// committed just before the cancel arrived); an unreachable server
    /// costs the answer no more than this.
    pub fn cancel_grace(self) -> Duration {
        self.twentieth()
    }

    fn twentieth(self) -> Duration {
        (self.0 / 20).clamp(Duration::from_millis(10), Duration::from_millis(100))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_are_a_half_and_a_twentieth_of_the_deadline_within_10_to_100_ms() {
        let of = |ms| Deadline::new(Duration::from_millis(ms));
        assert_eq!(of(1000).body_bound(), Duration::from_millis(500));
        assert_eq!(of(1000).lock_wait(), Duration::from_millis(50));
        assert_eq!(
            of(100).lock_wait(),
            Duration::from_millis(10),
            "never below 10 ms"
        );
        assert_eq!(
            of(5000).lock_wait(),
            Duration::from_millis(100),
            "the default deadline"
        );
        assert_eq!(
            of(60000).lock_wait(),
            Duration::from_millis(100),
            "never above 100 ms"
        );
        assert_eq!(of(5000).cancel_grace(), Duration::from_millis(100));
        assert_eq!(of(40).cancel_grace(), Duration::from_millis(10));
    }
}
