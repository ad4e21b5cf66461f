//! A run from start to summary: the main phase (events generated in closed
//! or open loop, with their bursts and on-time duplicates), then the late
//! phase (the held-back duplicates), settling each event when its last
//! delivery is over.
//!
//! Everything spawned goes into one [`TaskTracker`], so "the phase is over"
//! is "the tracker is empty": no event is counted before all its deliveries
//! have ended, and none is forgotten.

use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::future::join_all;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::{Load, ProviderConfig};
use super::delivery::{DeliveryEnd, Sender, TrackedEvent, Watch};
use super::plan::{EventKind, Planner};
use super::report::{AckRecord, Report};
use super::stats::{Role, Stats};

/// How often the progress line is printed.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

pub(crate) struct Run {
    sender: Sender,
    planner: Planner,
    stats: Stats,
    load: Load,
    events: Option<u64>,
    /// When generating started: the open loop's schedule counts from here.
    started: Instant,
    /// No event is started at or after this instant (`--duration-secs`).
    generate_until: Option<Instant>,
    burst_size: u32,
    late_delay: Duration,
    /// The last event number taken by a closed-loop sender.
    taken: AtomicU64,
    /// Events whose duplicate waits for the late phase.
    late: Mutex<Vec<Arc<TrackedEvent>>>,
    acks: Option<Mutex<AckFile>>,
    records: Option<Mutex<Vec<AckRecord>>>,
    /// Stops generating and retrying (Ctrl-C); attempts in flight finish.
    stop: CancellationToken,
    tasks: TaskTracker,
}

struct AckFile {
    writer: BufWriter<File>,
    /// The first write error, reported at the end.
    error: Option<std::io::Error>,
}

impl Run {
    pub(crate) fn new(config: &ProviderConfig, seed: u64, stop: CancellationToken) -> anyhow::Result<Self> {
        let acks = match &config.ack_file {
            Some(path) => {
                let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
                Some(Mutex::new(AckFile {
                    writer: BufWriter::new(file),
                    error: None,
                }))
            }
            None => None,
        };
        let sender = Sender::new(config).context("building the HTTP client")?;
        let started = Instant::now();
        Ok(Self {
            sender,
            planner: Planner::new(
                config.run_id.clone(),
                seed,
                config.mix,
                config.duplicates,
                config.bursts,
            ),
            stats: Stats::new(),
            load: config.load,
            events: config.events,
            started,
            generate_until: config.duration.map(|d| started + d),
            burst_size: config.bursts.size,
            late_delay: config.duplicates.late_delay,
            taken: AtomicU64::new(0),
            late: Mutex::new(Vec::new()),
            acks,
            records: config.keep_records.then(|| Mutex::new(Vec::new())),
            stop,
            tasks: TaskTracker::new(),
        })
    }

    /// Runs both phases and returns what happened.
    pub(crate) async fn run(self: Arc<Self>, progress: bool) -> anyhow::Result<Report> {
        let progress = progress.then(|| tokio::spawn(Arc::clone(&self).print_progress()));

        match self.load {
            Load::Closed { concurrency } => self.closed_loop(concurrency),
            Load::Open { rate } => self.open_loop(rate).await,
        }
        self.drain().await;
        self.late_phase().await;

        if let Some(progress) = progress {
            progress.abort();
        }
        if let Some(acks) = &self.acks {
            let mut acks = acks.lock().unwrap_or_else(PoisonError::into_inner);
            let flushed = acks.writer.flush();
            if let Some(err) = acks.error.take() {
                return Err(err).context("writing the ack file");
            }
            flushed.context("writing the ack file")?;
        }
        let records = match &self.records {
            Some(records) => std::mem::take(&mut *records.lock().unwrap_or_else(PoisonError::into_inner)),
            None => Vec::new(),
        };
        Ok(Report {
            summary: self.stats.summary(),
            records,
        })
    }

    /// `concurrency` senders, each taking the next event when done with its
    /// previous one.
    fn closed_loop(self: &Arc<Self>, concurrency: usize) {
        for _ in 0..concurrency {
            let run = Arc::clone(self);
            self.tasks.spawn(async move {
                while let Some(n) = run.take_event() {
                    run.event(n, Instant::now()).await;
                }
            });
        }
    }

    fn take_event(&self) -> Option<u64> {
        if self.stop.is_cancelled() || self.generate_until.is_some_and(|end| Instant::now() >= end) {
            return None;
        }
        let n = self.taken.fetch_add(1, Relaxed) + 1;
        (self.events.is_none_or(|max| n <= max)).then_some(n)
    }

    /// Event `n` is due at `started + (n - 1) / rate`, whatever happened to
    /// the others: each gets its own task, so a slow answer delays nothing
    /// else. A scheduler that falls behind (a busy core) catches up at
    /// once, and the lateness shows in the latencies (see `stats`).
    async fn open_loop(self: &Arc<Self>, rate: f64) {
        let mut n: u64 = 0;
        while self.events.is_none_or(|max| n < max) {
            let due = self.started + Duration::from_secs_f64(n as f64 / rate);
            if self.generate_until.is_some_and(|end| due >= end) {
                break;
            }
            if due > Instant::now() {
                tokio::select! {
                    () = tokio::time::sleep_until(due.into()) => {}
                    () = self.stop.cancelled() => break,
                }
            } else if self.stop.is_cancelled() {
                break;
            }
            n += 1;
            let run = Arc::clone(self);
            self.tasks.spawn(async move { run.event(n, due).await });
        }
    }

    /// Waits until everything spawned so far is over.
    async fn drain(&self) {
        self.tasks.close();
        self.tasks.wait().await;
        self.tasks.reopen();
    }

    /// Plans event `n`, starts its on-time duplicate, holds back a late
    /// one, and makes its own delivery (a burst if so planned), returning
    /// when that is over.
    async fn event(self: &Arc<Self>, n: u64, due: Instant) {
        let plan = self.planner.plan(n);
        self.stats.events.fetch_add(1, Relaxed);
        let firsts = if plan.burst { self.burst_size } else { 1 };
        let deliveries = firsts + u32::from(plan.duplicate.is_some());
        let tracked = Arc::new(TrackedEvent::new(n, plan.event, deliveries));
        match plan.duplicate {
            Some(duplicate) if duplicate.late => {
                self.late
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Arc::clone(&tracked));
            }
            Some(duplicate) => {
                let run = Arc::clone(self);
                let tracked = Arc::clone(&tracked);
                let due = due + duplicate.delay;
                self.tasks.spawn(async move {
                    tokio::select! {
                        () = tokio::time::sleep_until(due.into()) => {
                            run.deliver(&tracked, Role::Duplicate, n + 1, due).await;
                        }
                        () = run.stop.cancelled() => run.delivery_over(&tracked),
                    }
                });
            }
            None => {}
        }
        if plan.burst {
            // Polled together in this task: the burst's requests go out at
            // once, each on its own connection.
            join_all((0..u64::from(firsts)).map(|i| {
                let role = if i == 0 { Role::Primary } else { Role::Burst };
                self.deliver(&tracked, role, n + i, due)
            }))
            .await;
        } else {
            self.deliver(&tracked, Role::Primary, n, due).await;
        }
    }

    async fn deliver(&self, tracked: &TrackedEvent, role: Role, first_target: u64, due: Instant) {
        let end = self
            .sender
            .deliver(
                Watch {
                    stats: &self.stats,
                    stop: &self.stop,
                },
                tracked,
                role,
                first_target,
                due,
            )
            .await;
        if end == DeliveryEnd::Acknowledged
            && tracked.event.kind == EventKind::Payment
            && tracked.newly_processed()
            && let Some(order) = tracked.event.order
        {
            self.planner.paid(order);
        }
        self.delivery_over(tracked);
    }

    /// One delivery of `tracked` is over; the last one settles the event.
    fn delivery_over(&self, tracked: &TrackedEvent) {
        if !tracked.delivery_over() {
            return;
        }
        self.stats.settled(tracked.acknowledged_as(), tracked.rejected());
        if self.acks.is_none() && self.records.is_none() {
            return;
        }
        let record = tracked.record();
        if let Some(acks) = &self.acks {
            let mut acks = acks.lock().unwrap_or_else(PoisonError::into_inner);
            let AckFile { writer, error } = &mut *acks;
            if error.is_none() {
                let written = serde_json::to_writer(&mut *writer, &record)
                    .map_err(std::io::Error::from)
                    .and_then(|()| writer.write_all(b"\n"));
                *error = written.err();
            }
        }
        if let Some(records) = &self.records {
            records
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(record);
        }
    }

    /// The held-back duplicates, `late_delay` after the main phase, paced as
    /// the main phase was.
    async fn late_phase(self: &Arc<Self>) {
        let mut late = std::mem::take(&mut *self.late.lock().unwrap_or_else(PoisonError::into_inner));
        if late.is_empty() {
            return;
        }
        let waited = tokio::select! {
            () = tokio::time::sleep(self.late_delay) => true,
            () = self.stop.cancelled() => false,
        };
        if !waited {
            for tracked in &late {
                self.delivery_over(tracked);
            }
            return;
        }
        // In event order, as a provider's redelivery queue would have them.
        late.sort_unstable_by_key(|t| t.n);
        match self.load {
            Load::Closed { concurrency } => {
                let queue = Arc::new(Mutex::new(late.into_iter()));
                for _ in 0..concurrency {
                    let run = Arc::clone(self);
                    let queue = Arc::clone(&queue);
                    self.tasks.spawn(async move {
                        loop {
                            let next = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
                            let Some(tracked) = next else { break };
                            if run.stop.is_cancelled() {
                                run.delivery_over(&tracked);
                                continue;
                            }
                            run.deliver(&tracked, Role::Duplicate, tracked.n + 1, Instant::now())
                                .await;
                        }
                    });
                }
            }
            Load::Open { rate } => {
                let start = Instant::now();
                for (i, tracked) in late.into_iter().enumerate() {
                    let due = start + Duration::from_secs_f64(i as f64 / rate);
                    let run = Arc::clone(self);
                    self.tasks.spawn(async move {
                        tokio::select! {
                            () = tokio::time::sleep_until(due.into()) => {
                                run.deliver(&tracked, Role::Duplicate, tracked.n + 1, due).await;
                            }
                            () = run.stop.cancelled() => run.delivery_over(&tracked),
                        }
                    });
                }
            }
        }
        self.drain().await;
    }

    async fn print_progress(self: Arc<Self>) {
        let start = tokio::time::Instant::now();
        let mut ticks = tokio::time::interval_at(start + PROGRESS_EVERY, PROGRESS_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = (Instant::now(), 0);
        loop {
            ticks.tick().await;
            eprintln!("{}", self.stats.progress_line(self.events, &mut last));
        }
    }
}
