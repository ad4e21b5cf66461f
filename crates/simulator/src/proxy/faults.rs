//! What the network does to a connection: the fault settings (flags at
//! start, `POST /faults` at runtime) and the draw that gives each new
//! connection its [`Fate`].
//!
//! Two kinds of setting, on purpose:
//! - **Rates** (`cut_rate`, `blackhole_rate`) are drawn once per new
//!   connection, like a flaky link that loses some connections. They
//!   partition `[0, 1)` (black hole, then cut), so their sum may not exceed 1.
//!   A pooled keep-alive connection keeps the fate it was accepted with.
//! - **Switches** (`delay_ms`, `blackhole`, `refuse`, `cut_after_bytes`
//!   without `cut_rate`) describe the network as it is now, and apply to
//!   every connection, already open ones included, from the next chunk on.
//!   That is what reaches a client that holds a pool of keep-alive
//!   connections, as the relay does: a partition does not spare the
//!   connections that happened to be open.

use serde::{Deserialize, Serialize};

/// The fault settings. Every field has a default that means "no fault", so a
/// JSON object that omits a field resets it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Each chunk read from either side is held back this long before it is
    /// written to the other. A request and its answer each arrive in one
    /// chunk on loopback, so an exchange takes `2 * delay_ms` longer; past
    /// the client's timeout, the request still reaches the server (late,
    /// after the client gave up), as it would on a slow network.
    pub delay_ms: u64,
    /// Cut a connection once it has carried this many bytes from upstream:
    /// the client gets the first `cut_after_bytes` bytes of the answer and
    /// then a reset; both sides are closed with RST. `0` cuts as soon as the
    /// answer starts, so the request reached the server (which may have done
    /// the work) and no byte of its answer reached the client. Alone, it
    /// applies to every connection, open ones included; with `cut_rate`, only
    /// to the connections drawn.
    pub cut_after_bytes: Option<u64>,
    /// Share of new connections cut (after `cut_after_bytes`, default 0).
    pub cut_rate: f64,
    /// Share of new connections black-holed: accepted and read from, never
    /// connected upstream, never answered. The client sees a timeout.
    pub blackhole_rate: f64,
    /// Black-hole everything: new connections as with `blackhole_rate` 1,
    /// and open ones from now on (what they send and receive is read and
    /// dropped). A black-holed connection stays so until the client gives
    /// up, even after this is switched off: its bytes are lost.
    pub blackhole: bool,
    /// A downstream that is down: the listener is closed, so connecting is
    /// refused (`ECONNREFUSED`), and open connections are reset. Switching
    /// it off binds the same address again.
    pub refuse: bool,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            delay_ms: 0,
            cut_after_bytes: None,
            cut_rate: 0.0,
            blackhole_rate: 0.0,
            blackhole: false,
            refuse: false,
        }
    }
}

/// What happens to one connection, decided when it is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Forwarded, subject to the switches of the moment.
    Forward,
    /// Cut once more than `after` bytes come from upstream.
    Cut { after: u64 },
    /// Read from and dropped; never connected upstream.
    Blackhole,
}

impl Faults {
    /// Rates within `[0, 1]` and adding up to at most 1.
    pub fn validate(&self) -> Result<(), String> {
        let rates = [
            ("cut_rate", self.cut_rate),
            ("blackhole_rate", self.blackhole_rate),
        ];
        for (name, rate) in rates {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("{name} must be between 0 and 1, got {rate}"));
            }
        }
        let sum = self.cut_rate + self.blackhole_rate;
        if sum > 1.0 + 1e-9 {
            return Err(format!("cut_rate + blackhole_rate must be at most 1, got {sum}"));
        }
        Ok(())
    }

    /// A new connection's fate. With both rates at zero nothing is drawn.
    pub(crate) fn draw(&self) -> Fate {
        if self.blackhole {
            return Fate::Blackhole;
        }
        if self.cut_rate == 0.0 && self.blackhole_rate == 0.0 {
            return Fate::Forward;
        }
        let u: f64 = rand::random();
        if u < self.blackhole_rate {
            Fate::Blackhole
        } else if u - self.blackhole_rate < self.cut_rate {
            Fate::Cut {
                after: self.cut_after_bytes.unwrap_or(0),
            }
        } else {
            Fate::Forward
        }
    }

    /// The cut every connection gets now: `cut_after_bytes` without `cut_rate`.
    pub(crate) fn cut_for_all(&self) -> Option<u64> {
        if self.cut_rate == 0.0 {
            self.cut_after_bytes
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_forward_everything_without_drawing() {
        let faults = Faults::default();
        assert!(faults.validate().is_ok());
        assert_eq!(faults.draw(), Fate::Forward);
        assert_eq!(faults.cut_for_all(), None);
        let parsed: Faults = serde_json::from_str("{}").unwrap();
        assert_eq!(parsed, faults);
    }

    #[test]
    fn rates_are_checked() {
        for (cut_rate, blackhole_rate) in [(1.5, 0.0), (-0.1, 0.0), (0.0, 2.0), (0.6, 0.6)] {
            let faults = Faults {
                cut_rate,
                blackhole_rate,
                ..Faults::default()
            };
            assert!(faults.validate().is_err(), "{faults:?}");
        }
        let ok = Faults {
            cut_rate: 0.5,
            blackhole_rate: 0.5,
            ..Faults::default()
        };
        assert!(ok.validate().is_ok());
    }

    #[test]
    fn draws_follow_the_rates() {
        let faults = Faults {
            cut_rate: 0.3,
            blackhole_rate: 0.2,
            cut_after_bytes: Some(7),
            ..Faults::default()
        };
        let n = 20_000;
        let (mut cut, mut holed) = (0, 0);
        for _ in 0..n {
            match faults.draw() {
                Fate::Cut { after } => {
                    assert_eq!(after, 7);
                    cut += 1;
                }
                Fate::Blackhole => holed += 1,
                Fate::Forward => {}
            }
        }
        let share = |k: i32| f64::from(k) / f64::from(n);
        assert!((0.27..0.33).contains(&share(cut)), "cut {}", share(cut));
        assert!(
            (0.17..0.23).contains(&share(holed)),
            "black hole {}",
            share(holed)
        );
        assert_eq!(
            faults.cut_for_all(),
            None,
            "with a rate, only drawn connections are cut"
        );
    }

    #[test]
    fn switches_apply_to_every_connection() {
        let all = Faults {
            blackhole: true,
            ..Faults::default()
        };
        assert!((0..100).all(|_| all.draw() == Fate::Blackhole));
        let cut = Faults {
            cut_after_bytes: Some(0),
            ..Faults::default()
        };
        assert_eq!(cut.cut_for_all(), Some(0));
        assert_eq!(cut.draw(), Fate::Forward, "cut later, by the switch");
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(serde_json::from_str::<Faults>(r#"{"delay": 5}"#).is_err());
        let parsed: Faults = serde_json::from_str(r#"{"delay_ms": 5, "cut_after_bytes": 0}"#).unwrap();
        assert_eq!((parsed.delay_ms, parsed.cut_after_bytes), (5, Some(0)));
    }
}
