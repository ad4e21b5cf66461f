//! Several deliveries per statement, when they arrive together.
//!
//! Payments are recorded by leaders: a leader takes the queue's head, up to
//! [`MAX_BATCH`] deliveries of distinct event ids and distinct payment ids,
//! records them in one statement (`record_events_batch.sql`; a batch of one
//! runs `record_event.sql`, exactly the statement a lone payment always
//! ran), answers each from its own row, and goes back to the queue for
//! whatever arrived meanwhile. It retires when the queue is empty. This is
//! group commit: one round trip, one executor start-up and one commit for
//! every payment that arrived while the statement before them ran.
//!
//! A payment that arrives with no leader running starts one at once, so an
//! idle ingest answers as fast as it did without batching. Otherwise it
//! queues behind the running statement (a millisecond or two), and starts
//! another leader only when a full batch waits (the running ones cannot
//! keep up) or when it has waited [`LINGER`] (the statement ahead is slow:
//! a lone payment waiting for its order's lock, say). A leader also retires
//! when others run and less than a full batch waits, so leaders are as many
//! as the load needs and no more: more statements in flight than the load
//! needs would split the arrivals into smaller batches, each paying the
//! statement's and the commit's cost again. Measured: docs/BENCHMARK.md.
//!
//! What each delivery is promised does not change:
//! - Each is answered from its own row of the result. No two deliveries of
//!   one batch can depend on each other (distinct ids, distinct orders), and
//!   each batch holds its orders' locks, taken in the orders' id order, to
//!   its commit: per order, events still apply one after the other.
//! - A batch never waits for an order's lock (`SKIP LOCKED`): a delivery
//!   whose order someone else holds is not written, and is recorded on its
//!   own, where a held lock is waited for as before (`lock_timeout`, then
//!   tries with no connection). A batch that fails for any other reason
//!   (a deadlock with another ingest's batch, a dropped connection) wrote
//!   nothing, and each of its deliveries is recorded on its own.
//! - A batch runs under its earliest deadline. Past it, the statement is
//!   cancelled as a lone one would be (`http::abandon`), and every delivery
//!   of the batch is answered 503; a commit that wins the race is answered
//!   with the stored result on the provider's retry.
//! - Refunds and ignored types keep their own statements: they are rare,
//!   and a refund's statement has one more step.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use domain::ProviderEvent;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until, timeout_at};
use tracing::Instrument as _;

use crate::error::IngestError;
use crate::http::{self, Landed};
use crate::metrics::IngestMetrics;
use crate::notifier::Notifier;
use crate::storage::{self, Pending, Recorded};

/// The most deliveries one statement records. Eight already pay executor
/// start-up, the commit and the round trip once for eight; more would hold
/// more orders' locks for longer, and make a batch's failure costlier.
pub const MAX_BATCH: usize = 8;

/// How long a queued payment waits for the leaders running before it
/// starts one of its own. Longer than a statement normally takes under
/// load (1 to 5 ms here), so it does not split batches; short beside the
/// deadline, for the rare statement that waits (a lone payment whose order
/// someone holds locked waits up to `lock_timeout`, up to 100 ms).
pub const LINGER: Duration = Duration::from_millis(10);

/// What a delivery's turn in the queue gave it.
#[derive(Debug)]
pub enum Answer {
    /// The statement's answer: its own row of a batch, or, in a batch of
    /// one, exactly what `record_event.sql` answered (an error included,
    /// which the caller handles as the first of its tries).
    Tried(Result<Recorded, tokio_postgres::Error>),
    /// Nothing was written for it: its order was locked by someone else,
    /// or its batch failed. It is to be recorded on its own.
    Alone,
    /// Its statement outlived the deadline and was cancelled (a 503).
    Deadline,
    /// No connection could be had for its batch (the error's causes).
    Unavailable(String),
}

/// The queue of deliveries waiting for a leader, and what a batch needs.
pub struct Batcher {
    queue: Mutex<Queue>,
    pool: db::Pool,
    canceller: db::connect::Canceller,
    notifier: Arc<Notifier>,
    metrics: IngestMetrics,
    /// `INGEST_DEADLINE_MS`: how long an abandoned statement is waited for.
    deadline: Duration,
}

#[derive(Default)]
struct Queue {
    next_ticket: u64,
    jobs: VecDeque<Job>,
    /// Leaders running (each recording a batch, or about to).
    leaders: usize,
}

impl Queue {
    /// Whether a delivery queued now should start a leader: none runs, or a
    /// full batch waits beyond what the running ones are taking.
    fn wants_leader(&self) -> bool {
        self.leaders == 0 || self.jobs.len() >= MAX_BATCH
    }

    /// Whether a leader whose statement just ended stops here: nothing is
    /// queued, or others run and less than a full batch waits for them.
    fn leader_retires(&self) -> bool {
        self.jobs.is_empty() || (self.leaders > 1 && self.jobs.len() < MAX_BATCH)
    }
}

struct Job {
    ticket: u64,
    event: Arc<ProviderEvent>,
    raw: Arc<str>,
    trace_context: String,
    deadline: Instant,
    /// The request's span: the parent of the statement's span.
    span: tracing::Span,
    reply: oneshot::Sender<Answer>,
}

/// How long past its deadline a queued delivery waits for its batch's
/// answer: the batch answers at its earliest deadline, plus the cancel's
/// grace, plus this for the scheduler.
const ANSWER_SLACK: Duration = Duration::from_millis(50);

impl Batcher {
    pub fn new(
        pool: db::Pool,
        canceller: db::connect::Canceller,
        notifier: Arc<Notifier>,
        metrics: IngestMetrics,
        deadline: Duration,
    ) -> Self {
        Self {
            queue: Mutex::default(),
            pool,
            canceller,
            notifier,
            metrics,
            deadline,
        }
    }

    /// The first try of a [`storage::batchable`] delivery, in the current
    /// (request) span: queued, recorded by whichever leader takes it.
    pub async fn record(
        self: &Arc<Self>,
        event: &Arc<ProviderEvent>,
        raw: &Arc<str>,
        deadline: Instant,
        trace_context: &str,
    ) -> Result<Answer, IngestError> {
        let (reply, mut answer) = oneshot::channel();
        let (ticket, lead) = self.push(Job {
            ticket: 0,
            event: event.clone(),
            raw: raw.clone(),
            trace_context: trace_context.to_owned(),
            deadline,
            span: tracing::Span::current(),
            reply,
        });
        if lead {
            tokio::spawn(self.clone().lead());
        }
        let mut linger = Instant::now() + LINGER;
        loop {
            tokio::select! {
                biased;
                answered = &mut answer => return Ok(answered.unwrap_or(Answer::Alone)),
                () = sleep_until(linger.min(deadline)) => {}
            }
            if Instant::now() >= deadline {
                if self.withdraw(ticket) {
                    return Err(IngestError::Deadline);
                }
                break;
            }
            // Still queued after LINGER: the statements ahead are slow.
            match self.lead_for(ticket) {
                Some(true) => {
                    tokio::spawn(self.clone().lead());
                }
                Some(false) => {}
                // Taken by a batch meanwhile: its answer is on the way.
                None => break,
            }
            linger += LINGER;
        }
        match timeout_at(deadline + http::CANCEL_GRACE + ANSWER_SLACK, answer).await {
            Ok(Ok(answered)) => Ok(answered),
            // The batch's task ended without answering (the runtime is
            // shutting down): whatever it wrote, a try on its own finds.
            Ok(Err(_)) => Ok(Answer::Alone),
            Err(_) => Err(IngestError::Deadline),
        }
    }

    /// Queues `job`; its ticket, and whether the caller starts a leader
    /// (counted as running from here).
    fn push(&self, mut job: Job) -> (u64, bool) {
        let mut queue = self.queue.lock().expect("the batch queue's lock");
        queue.next_ticket += 1;
        job.ticket = queue.next_ticket;
        queue.jobs.push_back(job);
        let lead = queue.wants_leader();
        if lead {
            queue.leaders += 1;
        }
        (queue.next_ticket, lead)
    }

    /// For a delivery that waited [`LINGER`]: `None` if it is no longer
    /// queued, else whether the caller starts one more leader (counted as
    /// running from here).
    fn lead_for(&self, ticket: u64) -> Option<bool> {
        let mut queue = self.queue.lock().expect("the batch queue's lock");
        let position = queue.jobs.iter().position(|j| j.ticket == ticket)?;
        // Those ahead of it in the queue started leaders of their own if
        // they waited as long.
        let lead = position < MAX_BATCH;
        if lead {
            queue.leaders += 1;
        }
        Some(lead)
    }

    /// Removes a delivery that gives up before any batch took it.
    fn withdraw(&self, ticket: u64) -> bool {
        let mut queue = self.queue.lock().expect("the batch queue's lock");
        let before = queue.jobs.len();
        queue.jobs.retain(|j| j.ticket != ticket);
        queue.jobs.len() < before
    }

    /// The next batch for a running leader, or `None` when it retires (and
    /// is no longer counted).
    fn next_batch(&self, first: bool) -> Option<Vec<Job>> {
        let mut queue = self.queue.lock().expect("the batch queue's lock");
        queue.jobs.retain(|j| !j.reply.is_closed());
        if queue.jobs.is_empty() || (!first && queue.leader_retires()) {
            queue.leaders -= 1;
            return None;
        }
        Some(take(&mut queue.jobs))
    }

    /// A leader: batches from the queue, one statement at a time, until it
    /// retires.
    async fn lead(self: Arc<Self>) {
        let mut first = true;
        while let Some(jobs) = self.next_batch(first) {
            first = false;
            let deadline = jobs
                .iter()
                .map(|j| j.deadline)
                .min()
                .expect("a batch holds a delivery");
            match timeout_at(deadline, self.pool.get()).await {
                Ok(Ok(client)) => self.run(client, jobs, deadline).await,
                Ok(Err(e)) => {
                    let error = process::logs::error_chain(&e);
                    for job in jobs {
                        let _ = job.reply.send(Answer::Unavailable(error.clone()));
                    }
                }
                Err(_) => {
                    for job in jobs {
                        let _ = job.reply.send(Answer::Deadline);
                    }
                }
            }
        }
    }

    /// Runs one batch on `client` and answers each of its deliveries.
    async fn run(&self, client: db::Client, mut jobs: Vec<Job>, deadline: Instant) {
        let size = jobs.len();
        let spans: Vec<tracing::Span> = jobs
            .iter()
            .map(|job| {
                let span = http::record_span(&job.span);
                if size > 1 {
                    span.record("db.operation.batch.size", size);
                }
                span
            })
            .collect();
        if size == 1 {
            let job = jobs.pop().expect("one delivery");
            let answer = match http::record_alone(
                client,
                &job.event,
                &job.raw,
                &job.trace_context,
                deadline,
                &spans[0],
                &self.canceller,
                &self.notifier,
                self.deadline,
            )
            .await
            {
                Ok(result) => Answer::Tried(result),
                Err(_) => Answer::Deadline,
            };
            let _ = job.reply.send(answer);
            return;
        }

        // Taken now: once the statement is sent, its connection belongs to it.
        let session = self.canceller.session_of(&client);
        let mut recording = Box::pin(record_batch_on(client, jobs.iter().map(Job::parts).collect()));
        let answered = timeout_at(deadline, &mut recording)
            .instrument(spans[0].clone())
            .await;
        let answers: Vec<Answer> = match answered {
            Ok((client, Ok(rows))) => {
                drop(client);
                self.metrics.batches.inc();
                self.metrics.batched.inc_by(size as u64);
                rows.into_iter()
                    .map(|row| match row {
                        Some(recorded) => Answer::Tried(Ok(recorded)),
                        None => {
                            self.metrics.batch_contended.inc();
                            Answer::Alone
                        }
                    })
                    .collect()
            }
            Ok((client, Err(e))) => {
                drop(client);
                for span in &spans {
                    span.record("otel.status_code", "ERROR");
                }
                tracing::info!(
                    parent: &spans[0],
                    size,
                    error = %process::logs::error_chain(&e),
                    "a batch of deliveries failed and wrote nothing; each is recorded on its own"
                );
                self.metrics.batch_failures.inc();
                (0..size).map(|_| Answer::Alone).collect()
            }
            Err(_) => {
                for span in &spans {
                    span.record("otel.status_code", "ERROR");
                }
                let what = format!("{} and {} more", jobs[0].event.id, size - 1);
                self.abandon(recording, session, &what)
                    .instrument(spans[0].clone())
                    .await;
                (0..size).map(|_| Answer::Deadline).collect()
            }
        };
        drop(spans);
        for (job, answer) in jobs.into_iter().zip(answers) {
            let _ = job.reply.send(answer);
        }
    }

    async fn abandon<F, T>(
        &self,
        recording: std::pin::Pin<Box<F>>,
        session: tokio_postgres::CancelToken,
        what: &str,
    ) where
        F: Future<Output = (db::Client, Result<T, tokio_postgres::Error>)> + Send + 'static,
        T: Landed + Send + 'static,
    {
        http::abandon(
            recording,
            session,
            &self.canceller,
            &self.notifier,
            self.deadline,
            what,
        )
        .await;
    }
}

/// The next batch: the queue's oldest deliveries, up to [`MAX_BATCH`],
/// skipping (and keeping queued, in their order) any whose event id or
/// payment id the batch already holds.
fn take(jobs: &mut VecDeque<Job>) -> Vec<Job> {
    let mut batch = Vec::new();
    let mut ids = HashSet::new();
    let mut payments = HashSet::new();
    let mut kept = VecDeque::with_capacity(jobs.len());
    while let Some(job) = jobs.pop_front() {
        let payment = job.event.payment_id.as_deref();
        let fits = !ids.contains(job.event.id.as_str()) && payment.is_none_or(|p| !payments.contains(p));
        if fits {
            ids.insert(job.event.id.clone());
            if let Some(p) = payment {
                payments.insert(p.to_owned());
            }
            batch.push(job);
        } else {
            kept.push_back(job);
        }
        if batch.len() == MAX_BATCH {
            break;
        }
    }
    kept.append(jobs);
    *jobs = kept;
    batch
}

impl Job {
    fn parts(&self) -> (Arc<ProviderEvent>, Arc<str>, String) {
        (self.event.clone(), self.raw.clone(), self.trace_context.clone())
    }
}

/// The batch statement on a connection it owns (see `http::record_on`).
async fn record_batch_on(
    client: db::Client,
    batch: Vec<(Arc<ProviderEvent>, Arc<str>, String)>,
) -> (db::Client, Result<Vec<Option<Recorded>>, tokio_postgres::Error>) {
    let client = http::InFlight::new(client);
    let pending: Vec<Pending<'_>> = batch
        .iter()
        .map(|(event, raw, trace_context)| Pending {
            event,
            raw_body: raw,
            trace_context,
        })
        .collect();
    let result = storage::record_events(client.get(), &pending).await;
    drop(pending);
    (client.answered(), result)
}

impl Landed for Vec<Option<Recorded>> {
    fn claimed(&self) -> usize {
        self.iter().flatten().map(Landed::claimed).sum()
    }

    fn enqueued(&self) -> i32 {
        self.iter().flatten().map(Recorded::enqueued).sum()
    }
}
