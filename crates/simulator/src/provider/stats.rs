//! Live counters of a run: atomics for the counts, one HdrHistogram of
//! attempt latencies in microseconds (plus one for the current second, for
//! the progress line), and the ingest's answers per event.
//!
//! # What a latency is
//! An attempt's latency runs from when it was *due* to when its answer was
//! read in full. In closed loop an attempt is due when its sender gets to it,
//! so this is the plain response time. In open loop the first attempt is due
//! at its place in the schedule: if the generator (or a server holding up
//! its connections) starts it late, the wait counts, as it would for a real
//! provider's queue. Timing from the actual send instead would hide exactly
//! the stalls a benchmark looks for: a server that freezes for a second
//! would show one slow request rather than a second's worth of them (the
//! "coordinated omission" of load generators). Retries and duplicates are
//! due when their timer fires.
//!
//! Attempts that end without an answer (timeouts, connection errors) are
//! counted, not timed: a refused connection would put near-zero "latencies"
//! into the histogram, a timeout only the timeout itself.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::report::{LatencyMs, Summary};

/// Status codes are counted in a flat array indexed by code; anything
/// outside 100..=599 is counted as 599.
const STATUS_SLOTS: usize = 600;

/// Highest latency the histogram tells apart: an hour, in microseconds.
/// Anything longer is recorded as an hour.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// The kind of delivery an attempt belongs to, for the counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The event's own delivery (the first of a burst).
    Primary,
    /// The other deliveries of a burst.
    Burst,
    /// A duplicate, on time or late.
    Duplicate,
}

/// An attempt that got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoAnswer {
    Timeout,
    Connection,
}

pub(crate) struct Stats {
    started: Instant,
    cpu_at_start: Option<f64>,
    pub(crate) events: AtomicU64,
    pub(crate) settled: AtomicU64,
    acknowledged: AtomicU64,
    failed: AtomicU64,
    permanent_failures: AtomicU64,
    deliveries: AtomicU64,
    duplicate_deliveries: AtomicU64,
    burst_deliveries: AtomicU64,
    retries: AtomicU64,
    timeouts: AtomicU64,
    connection_errors: AtomicU64,
    replayed: AtomicU64,
    /// Deliveries waiting for their next attempt right now.
    pub(crate) retrying: AtomicU64,
    statuses: Box<[AtomicU64]>,
    latency: Mutex<Latencies>,
    /// The ingest's `status` per acknowledged event.
    outcomes: Mutex<BTreeMap<String, u64>>,
}

struct Latencies {
    total: Histogram<u64>,
    /// Since the last progress line.
    recent: Histogram<u64>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

impl Stats {
    pub(crate) fn new() -> Self {
        Self {
            started: Instant::now(),
            cpu_at_start: process_cpu_secs(),
            events: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            acknowledged: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            permanent_failures: AtomicU64::new(0),
            deliveries: AtomicU64::new(0),
            duplicate_deliveries: AtomicU64::new(0),
            burst_deliveries: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            connection_errors: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            retrying: AtomicU64::new(0),
            statuses: (0..STATUS_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            latency: Mutex::new(Latencies {
                total: histogram(),
                recent: histogram(),
            }),
            outcomes: Mutex::new(BTreeMap::new()),
        }
    }

    fn count_attempt(&self, role: Role, retry: bool) {
        self.deliveries.fetch_add(1, Relaxed);
        if retry {
            self.retries.fetch_add(1, Relaxed);
        }
        match role {
            Role::Primary => {}
            Role::Burst => {
                self.burst_deliveries.fetch_add(1, Relaxed);
            }
            Role::Duplicate => {
                self.duplicate_deliveries.fetch_add(1, Relaxed);
            }
        }
    }

    /// An attempt answered (status line, headers and body read).
    pub(crate) fn answered(&self, role: Role, retry: bool, status: u16, replayed: bool, latency: Duration) {
        self.count_attempt(role, retry);
        let slot = usize::from(status).clamp(100, STATUS_SLOTS - 1);
        self.statuses[slot].fetch_add(1, Relaxed);
        if replayed {
            self.replayed.fetch_add(1, Relaxed);
        }
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX).max(1);
        let mut latencies = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
        latencies.total.saturating_record(us);
        latencies.recent.saturating_record(us);
    }

    /// An attempt that got no answer.
    pub(crate) fn unanswered(&self, role: Role, retry: bool, why: NoAnswer) {
        self.count_attempt(role, retry);
        match why {
            NoAnswer::Timeout => self.timeouts.fetch_add(1, Relaxed),
            NoAnswer::Connection => self.connection_errors.fetch_add(1, Relaxed),
        };
    }

    /// An event is settled: every delivery of it is over.
    pub(crate) fn settled(&self, acknowledged_as: Option<&str>, rejected: bool) {
        self.settled.fetch_add(1, Relaxed);
        match acknowledged_as {
            Some(status) => {
                self.acknowledged.fetch_add(1, Relaxed);
                let mut outcomes = self.outcomes.lock().unwrap_or_else(PoisonError::into_inner);
                match outcomes.get_mut(status) {
                    Some(n) => *n += 1,
                    None => {
                        outcomes.insert(status.to_owned(), 1);
                    }
                }
            }
            None => {
                self.failed.fetch_add(1, Relaxed);
                if rejected {
                    self.permanent_failures.fetch_add(1, Relaxed);
                }
            }
        }
    }

    /// `[provider] 12.0s  events 5231/10000  deliveries 5790  2xx 5701  503 12
    /// timeouts 3  retrying 7  rps 437  p99 8.2ms`: rps and p99 over the last
    /// interval, every other number since the start.
    pub(crate) fn progress_line(&self, total_events: Option<u64>, last: &mut (Instant, u64)) -> String {
        use std::fmt::Write as _;
        let now = Instant::now();
        let deliveries = self.deliveries.load(Relaxed);
        let interval = now.duration_since(last.0).as_secs_f64().max(1e-3);
        let rps = (deliveries - last.1) as f64 / interval;
        *last = (now, deliveries);
        let p99 = {
            let mut latencies = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
            let p99 = (!latencies.recent.is_empty()).then(|| latencies.recent.value_at_quantile(0.99));
            latencies.recent.reset();
            p99
        };

        let mut line = format!(
            "[provider] {:.1}s  events {}",
            self.started.elapsed().as_secs_f64(),
            self.settled.load(Relaxed)
        );
        if let Some(total) = total_events {
            let _ = write!(line, "/{total}");
        }
        let _ = write!(line, "  deliveries {deliveries}  2xx {}", self.count_2xx());
        for (code, count) in self.status_counts() {
            if !code.starts_with('2') {
                let _ = write!(line, "  {code} {count}");
            }
        }
        let _ = write!(line, "  timeouts {}", self.timeouts.load(Relaxed));
        let connection_errors = self.connection_errors.load(Relaxed);
        if connection_errors > 0 {
            let _ = write!(line, "  conn-errors {connection_errors}");
        }
        let _ = write!(
            line,
            "  retrying {}  rps {rps:.0}  p99 ",
            self.retrying.load(Relaxed)
        );
        match p99 {
            Some(us) => {
                let _ = write!(line, "{:.1}ms", us as f64 / 1000.0);
            }
            None => line.push('-'),
        }
        line
    }

    fn count_2xx(&self) -> u64 {
        self.statuses[200..300].iter().map(|c| c.load(Relaxed)).sum()
    }

    fn status_counts(&self) -> BTreeMap<String, u64> {
        self.statuses
            .iter()
            .enumerate()
            .filter_map(|(code, count)| {
                let count = count.load(Relaxed);
                (count > 0).then(|| (code.to_string(), count))
            })
            .collect()
    }

    /// The numbers so far, as the run's result (the caller adds the run id and seed).
    pub(crate) fn summary(&self) -> Summary {
        let elapsed = self.started.elapsed().as_secs_f64();
        let deliveries = self.deliveries.load(Relaxed);
        let latency_ms = {
            let latencies = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
            let h = &latencies.total;
            let ms = |us: u64| us as f64 / 1000.0;
            if h.is_empty() {
                LatencyMs::default()
            } else {
                LatencyMs {
                    p50: ms(h.value_at_quantile(0.50)),
                    p90: ms(h.value_at_quantile(0.90)),
                    p99: ms(h.value_at_quantile(0.99)),
                    p999: ms(h.value_at_quantile(0.999)),
                    max: ms(h.max()),
                    mean: h.mean() / 1000.0,
                }
            }
        };
        Summary {
            events: self.events.load(Relaxed),
            acknowledged: self.acknowledged.load(Relaxed),
            failed: self.failed.load(Relaxed),
            permanent_failures: self.permanent_failures.load(Relaxed),
            deliveries,
            duplicate_deliveries: self.duplicate_deliveries.load(Relaxed),
            burst_deliveries: self.burst_deliveries.load(Relaxed),
            retries: self.retries.load(Relaxed),
            timeouts: self.timeouts.load(Relaxed),
            connection_errors: self.connection_errors.load(Relaxed),
            status_counts: self.status_counts(),
            replayed: self.replayed.load(Relaxed),
            elapsed_secs: elapsed,
            deliveries_per_sec: if elapsed > 0.0 {
                deliveries as f64 / elapsed
            } else {
                0.0
            },
            latency_ms,
            outcomes: self
                .outcomes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            cpu_secs: process_cpu_secs()
                .zip(self.cpu_at_start)
                .map(|(now, start)| now - start),
            ..Summary::default()
        }
    }
}

/// Clock ticks per second in `/proc/<pid>/stat`: `USER_HZ`, which Linux
/// fixes at 100 for every architecture's user-space ABI.
const USER_HZ: f64 = 100.0;

/// User plus system CPU time of this whole process (every thread), from
/// `/proc/self/stat`; `None` where there is no procfs.
pub(crate) fn process_cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: the
    // fields after its closing one start at field 3, `state`.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_ascii_whitespace();
    // utime and stime are fields 14 and 15: the 12th and 13th after `state`.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / USER_HZ)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_and_the_progress_line_reads_well() {
        let stats = Stats::new();
        stats.events.store(3, Relaxed);
        stats.answered(Role::Primary, false, 503, false, Duration::from_millis(2));
        stats.answered(Role::Primary, true, 200, false, Duration::from_millis(4));
        stats.answered(Role::Burst, false, 200, true, Duration::from_millis(8));
        stats.unanswered(Role::Duplicate, false, NoAnswer::Timeout);
        stats.unanswered(Role::Primary, true, NoAnswer::Connection);
        stats.settled(Some("processed"), false);
        stats.settled(None, true);
        stats.settled(None, false);

        let mut last = (stats.started, 0);
        let line = stats.progress_line(Some(10), &mut last);
        assert!(line.starts_with("[provider] "), "{line}");
        for part in [
            "events 3/10",
            "deliveries 5",
            "2xx 2",
            "503 1",
            "timeouts 1",
            "conn-errors 1",
            "retrying 0",
            "p99 8.0ms",
        ] {
            assert!(line.contains(part), "{part:?} in {line}");
        }
        assert_eq!(last.1, 5);
        // The interval histogram starts again; the total keeps everything.
        assert!(stats.progress_line(None, &mut last).ends_with("p99 -"));

        let s = stats.summary();
        assert_eq!(
            (s.events, s.acknowledged, s.failed, s.permanent_failures),
            (3, 1, 2, 1)
        );
        assert_eq!((s.deliveries, s.retries, s.replayed), (5, 2, 1));
        assert_eq!((s.burst_deliveries, s.duplicate_deliveries), (1, 1));
        assert_eq!((s.timeouts, s.connection_errors), (1, 1));
        assert_eq!(
            s.status_counts,
            BTreeMap::from([("200".into(), 2), ("503".into(), 1)])
        );
        assert_eq!(s.outcomes, BTreeMap::from([("processed".into(), 1)]));
        assert!((s.latency_ms.max - 8.0).abs() < 0.01, "{:?}", s.latency_ms);
        assert!((s.latency_ms.p50 - 4.0).abs() < 0.01, "{:?}", s.latency_ms);
    }

    #[test]
    fn cpu_time_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            let cpu = process_cpu_secs().expect("procfs");
            assert!(cpu >= 0.0);
        }
    }
}
