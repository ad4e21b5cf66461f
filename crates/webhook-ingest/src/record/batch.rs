//! Several deliveries per statement, when they arrive together.
//!
//! Payments are recorded by leaders: a leader takes the queue's head, up to
//! [`MAX_BATCH`](super::MAX_BATCH) deliveries of distinct event ids and
//! distinct payment ids, records them in one statement (`record_events_batch.sql`; a batch of one
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
//!   cancelled as a lone one would be (`Statements::abandon`), and every
//!   delivery of the batch is answered 503; a commit that wins the race is
//!   answered with the stored result on the provider's retry.
//! - Refunds and ignored types keep their own statements: they are rare,
//!   and a refund's statement has one more step.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until, timeout_at};

use super::queue::{Answer, Job, Queue};
use super::statement::{Received, Statements};
use crate::error::IngestError;

/// How long a queued payment waits for the leaders running before it
/// starts one of its own. Longer than a statement normally takes under
/// load (1 to 5 ms here), so it does not split batches; short beside the
/// deadline, for the rare statement that waits (a lone payment whose order
/// someone holds locked waits up to `lock_timeout`, up to 100 ms).
pub const LINGER: Duration = Duration::from_millis(10);

/// How long past its deadline a queued delivery waits for its batch's
/// answer: the batch answers at its earliest deadline, plus the cancel's
/// grace, plus this for the scheduler.
const ANSWER_SLACK: Duration = Duration::from_millis(50);

/// The queue of payments waiting for a leader, and the statements it runs.
pub(super) struct Batcher {
    queue: Mutex<Queue>,
    statements: Arc<Statements>,
}

impl Batcher {
    pub(super) fn new(statements: Arc<Statements>) -> Self {
        Self {
            queue: Mutex::default(),
            statements,
        }
    }

    /// The first try of a [`crate::storage::batchable`] delivery, in the
    /// current (request) span: queued, recorded by whichever leader takes it.
    pub(super) async fn enqueue(self: &Arc<Self>, received: &Received) -> Result<Answer, IngestError> {
        let deadline = received.deadline;
        let (reply, mut answer) = oneshot::channel();
        let (ticket, lead) = self.queue().push(Job {
            ticket: 0,
            received: received.clone(),
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
                if self.queue().withdraw(ticket) {
                    return Err(IngestError::Deadline);
                }
                break;
            }
            // Still queued after LINGER: the statements ahead are slow.
            let lead = self.queue().lead_for(ticket);
            match lead {
                Some(true) => {
                    tokio::spawn(self.clone().lead());
                }
                Some(false) => {}
                // Taken by a batch meanwhile: its answer is on the way.
                None => break,
            }
            linger += LINGER;
        }
        let grace = self.statements.deadline.cancel_grace();
        match timeout_at(deadline + grace + ANSWER_SLACK, answer).await {
            Ok(Ok(answered)) => Ok(answered),
            // The batch's task ended without answering (the runtime is
            // shutting down): whatever it wrote, a try on its own finds.
            Ok(Err(_)) => Ok(Answer::Alone),
            Err(_) => Err(IngestError::Deadline),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().expect("the batch queue's lock")
    }

    /// A leader: batches from the queue, one statement at a time, until it
    /// retires.
    async fn lead(self: Arc<Self>) {
        let mut first = true;
        loop {
            let Some(jobs) = self.queue().next_batch(first) else {
                return;
            };
            first = false;
            let deadline = jobs
                .iter()
                .map(|j| j.received.deadline)
                .min()
                .expect("a batch holds a delivery");
            match timeout_at(deadline, self.statements.pool.get()).await {
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
        let statements = &self.statements;
        let size = jobs.len();
        // A batch of one runs `record_event.sql`, as a lone payment does.
        if size == 1 {
            let job = jobs.pop().expect("one delivery");
            let span = statements.alone_span(&job.span, &job.received.event);
            let answer = match statements.alone(client, &job.received, &span).await {
                Some(result) => Answer::Tried(result),
                None => Answer::Deadline,
            };
            drop(span);
            let _ = job.reply.send(answer);
            return;
        }

        let spans: Vec<tracing::Span> = jobs
            .iter()
            .map(|job| statements.batch_span(&job.span, size))
            .collect();
        let batch = jobs.iter().map(|job| job.received.clone()).collect();
        let answers: Vec<Answer> = match statements.batch(client, batch, deadline, &spans[0]).await {
            Some(Ok(rows)) => {
                statements.metrics.batches.inc();
                statements.metrics.batched.inc_by(size as u64);
                rows.into_iter()
                    .map(|row| match row {
                        Some(recorded) => Answer::Tried(Ok(recorded)),
                        None => {
                            statements.metrics.batch_contended.inc();
                            Answer::Alone
                        }
                    })
                    .collect()
            }
            Some(Err(e)) => {
                for span in &spans {
                    db::span::failed(span, &e);
                }
                tracing::info!(
                    parent: &spans[0],
                    size,
                    error = %process::logs::error_chain(&e),
                    "a batch of deliveries failed and wrote nothing; each is recorded on its own"
                );
                statements.metrics.batch_failures.inc();
                (0..size).map(|_| Answer::Alone).collect()
            }
            None => {
                for span in &spans {
                    db::span::timed_out(span);
                }
                (0..size).map(|_| Answer::Deadline).collect()
            }
        };
        drop(spans);
        for (job, answer) in jobs.into_iter().zip(answers) {
            let _ = job.reply.send(answer);
        }
    }
}
