//! Several deliveries per statement, when they arrive together.
//!
//! A payment that finds other statements running does not wait for a
//! connection for itself alone: it joins a queue, then waits for a
//! connection. Whoever gets one takes the queue's head, up to [`MAX_BATCH`]
//! deliveries of distinct event ids and distinct payment ids, and records
//! them in one statement (`record_events_batch.sql`): one round trip, one
//! executor start-up, one commit for all of them. A delivery whose own
//! connection arrives after its turn came hands the connection to the next
//! batch (or back to the pool) and waits for its answer.
//!
//! So batches form only when deliveries overlap: while at most one
//! statement runs (a connection free, nobody queued) a delivery runs alone,
//! in exactly the statement it always did (`record_event.sql`), with
//! nothing added to its latency. Measured on the references, eight events
//! per statement cost a third of the database's CPU per event of one
//! statement per event (docs/BENCHMARK.md).
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
use tokio::time::{Instant, timeout_at};
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

/// Statements running below which a payment runs alone rather than queue.
pub const ALONE_BELOW: usize = 2;

/// What a delivery's turn in the queue gave it.
#[derive(Debug)]
pub enum Answer {
    /// The statement's answer: its own row of a batch, or, when it ran
    /// alone, exactly what `record_event.sql` answered (an error included,
    /// which the caller handles as the first of its tries).
    Tried(Result<Recorded, tokio_postgres::Error>),
    /// Nothing was written for it: a connection was free (nothing to batch
    /// with), its order was locked by someone else, or its batch failed. It
    /// is to be recorded on its own.
    Alone,
    /// Its statement outlived the deadline and was cancelled (a 503).
    Deadline,
}

/// The queue of deliveries waiting for a connection, and what a batch
/// needs once it has one.
pub struct Batcher {
    queue: Mutex<Queue>,
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
        canceller: db::connect::Canceller,
        notifier: Arc<Notifier>,
        metrics: IngestMetrics,
        deadline: Duration,
    ) -> Self {
        Self {
            queue: Mutex::default(),
            canceller,
            notifier,
            metrics,
            deadline,
        }
    }

    /// The first try of a [`storage::batchable`] delivery, in the current
    /// (request) span: queued, recorded by whichever batch takes it.
    pub async fn record(
        self: &Arc<Self>,
        pool: &db::Pool,
        event: &Arc<ProviderEvent>,
        raw: &Arc<str>,
        deadline: Instant,
        trace_context: &str,
    ) -> Result<Answer, IngestError> {
        // At most one statement running, a connection free and nobody
        // queued: nothing to batch with, and nothing to wait for. The
        // delivery runs alone, as it always did. (Running alone whenever a
        // connection is free left busy cores unbatched: docs/BENCHMARK.md.)
        if pool.busy() < ALONE_BELOW && pool.has_room() && self.is_empty() {
            return Ok(Answer::Alone);
        }
        let (reply, mut answer) = oneshot::channel();
        let ticket = self.push(Job {
            ticket: 0,
            event: event.clone(),
            raw: raw.clone(),
            trace_context: trace_context.to_owned(),
            deadline,
            span: tracing::Span::current(),
            reply,
        });
        loop {
            let client = tokio::select! {
                biased;
                answered = &mut answer => return Ok(answered.unwrap_or(Answer::Alone)),
                client = timeout_at(deadline, pool.get()) => client,
            };
            match client {
                Ok(Ok(client)) => {
                    let jobs = self.take();
                    if jobs.is_empty() {
                        drop(client);
                    } else {
                        tokio::spawn(self.clone().run(client, jobs));
                    }
                    if !self.queued(ticket) {
                        break;
                    }
                    // Still queued (the batch was full, or held its order or
                    // id): another connection, for the next batch.
                }
                Err(_) if self.withdraw(ticket) => return Err(IngestError::Deadline),
                Ok(Err(e)) if self.withdraw(ticket) => {
                    return Err(IngestError::Unavailable(process::logs::error_chain(&e)));
                }
                // Taken by a batch meanwhile: its answer is on the way.
                Err(_) | Ok(Err(_)) => break,
            }
        }
        match timeout_at(deadline + http::CANCEL_GRACE + ANSWER_SLACK, answer).await {
            Ok(Ok(answered)) => Ok(answered),
            // The batch's task ended without answering (the runtime is
            // shutting down): whatever it wrote, a try on its own finds.
            Ok(Err(_)) => Ok(Answer::Alone),
            Err(_) => Err(IngestError::Deadline),
        }
    }

    fn push(&self, mut job: Job) -> u64 {
        let mut queue = self.queue.lock().expect("the batch queue's lock");
        queue.next_ticket += 1;
        job.ticket = queue.next_ticket;
        queue.jobs.push_back(job);
        queue.next_ticket
    }

    fn is_empty(&self) -> bool {
        self.queue.lock().expect("the batch queue's lock").jobs.is_empty()
    }

    fn queued(&self, ticket: u64) -> bool {
        let queue = self.queue.lock().expect("the batch queue's lock");
        queue.jobs.iter().any(|j| j.ticket == ticket)
    }

    /// Removes a delivery that gives up before any batch took it.
    fn withdraw(&self, ticket: u64) -> bool {
        let mut queue = self.queue.lock().expect("the batch queue's lock");
        let before = queue.jobs.len();
        queue.jobs.retain(|j| j.ticket != ticket);
        queue.jobs.len() < before
    }

    /// The next batch: the queue's oldest deliveries, up to [`MAX_BATCH`],
    /// skipping (and keeping queued, in their order) any whose event id or
    /// payment id the batch already holds. Deliveries whose requests have
    /// gone (their answer would reach nobody) are dropped.
    fn take(&self) -> Vec<Job> {
        let mut queue = self.queue.lock().expect("the batch queue's lock");
        let mut batch = Vec::new();
        let mut ids = HashSet::new();
        let mut payments = HashSet::new();
        let mut kept = VecDeque::with_capacity(queue.jobs.len());
        while let Some(job) = queue.jobs.pop_front() {
            if job.reply.is_closed() {
                continue;
            }
            let payment = job.event.payment_id.as_deref();
            let fits = batch.len() < MAX_BATCH
                && !ids.contains(job.event.id.as_str())
                && payment.is_none_or(|p| !payments.contains(p));
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
        kept.append(&mut queue.jobs);
        queue.jobs = kept;
        batch
    }

    /// Runs one batch on `client` and answers each of its deliveries.
    async fn run(self: Arc<Self>, client: db::Client, mut jobs: Vec<Job>) {
        let deadline = jobs
            .iter()
            .map(|j| j.deadline)
            .min()
            .expect("a batch holds a delivery");
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
