//! A line every few seconds from the long tests (the chaos test and the
//! history checker), which `make soak` runs for minutes with `--nocapture`:
//! what was sent, acknowledged and done so far, the rate, the phase. On
//! stderr, which the test runner captures in a normal run and shows only
//! with a failing test's output.

use std::time::{Duration, Instant};

/// How often [`Progress::due`] says a line is due.
pub const EVERY: Duration = Duration::from_secs(5);

pub struct Progress {
    test: &'static str,
    started: Instant,
    /// When the last line was printed, its phase, and the count its rate
    /// was of.
    last: Last,
}

struct Last {
    at: Instant,
    phase: String,
    count: u64,
}

impl Progress {
    pub fn start(test: &'static str) -> Self {
        let now = Instant::now();
        Self {
            test,
            started: now,
            last: Last {
                at: now,
                phase: String::new(),
                count: 0,
            },
        }
    }

    /// Whether [`EVERY`] has passed since the last line.
    pub fn due(&self) -> bool {
        self.last.at.elapsed() >= EVERY
    }

    /// `[chaos  45.2s] sending: <what>; 350 events/s over the last 5.0 s`:
    /// the rate of `count`, a running total of `unit` in this phase, since
    /// the previous line (since the start for the first line; none on the
    /// first line of another phase).
    pub fn line(&mut self, phase: &str, what: &str, count: u64, unit: &str) {
        let now = Instant::now();
        let secs = now.duration_since(self.last.at).as_secs_f64().max(1e-3);
        let rate = count.saturating_sub(self.last.count) as f64 / secs;
        let same_phase = self.last.phase == phase || self.last.phase.is_empty();
        self.last = Last {
            at: now,
            phase: phase.to_owned(),
            count,
        };
        if same_phase {
            self.note(&format!(
                "{phase}: {what}; {rate:.0} {unit}/s over the last {secs:.1} s"
            ));
        } else {
            self.note(&format!("{phase}: {what}"));
        }
    }

    /// A line now, outside the rhythm: a phase starting, a kill, a restart.
    pub fn note(&self, what: &str) {
        eprintln!(
            "[{} {:>6.1}s] {what}",
            self.test,
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// `200000` as `200,000`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[test]
fn thousands_are_grouped() {
    assert_eq!(thousands(0), "0");
    assert_eq!(thousands(999), "999");
    assert_eq!(thousands(1000), "1,000");
    assert_eq!(thousands(200_000), "200,000");
    assert_eq!(thousands(1_234_567), "1,234,567");
}
