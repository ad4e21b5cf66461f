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
    /// Where the pool's statements go, as their client spans say it.
    span_server: db::span::Server,
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
    /// Queues `job`; its ticket, and whether its caller starts a leader
    /// (counted from here): when none runs, or when a full batch waits
    /// beyond what the running ones are taking.
    fn push(&mut self, mut job: Job) -> (u64, bool) {
        self.next_ticket += 1;
        job.ticket = self.next_ticket;
        self.jobs.push_back(job);
        let lead = self.leaders == 0 || self.jobs.len() >= MAX_BATCH;
        if lead {
            self.leaders += 1;
        }
        (self.next_ticket, lead)
    }

    /// For a delivery that waited [`LINGER`] (the statements ahead are
    /// slow): `None` if it is no longer queued, else whether its caller
    /// starts one more leader (counted from here). Only a delivery within a
    /// batch of the queue's head does: those ahead of it waited longer, and
    /// started leaders of their own.
    fn lead_for(&mut self, ticket: u64) -> Option<bool> {
        let position = self.jobs.iter().position(|j| j.ticket == ticket)?;
        let lead = position < MAX_BATCH;
        if lead {
            self.leaders += 1;
        }
        Some(lead)
    }

    /// The next batch for a running leader (deliveries whose requests have
    /// gone are dropped first), or `None` when it retires (and is no longer
    /// counted): nothing is queued, or, after its `first` batch, others run
    /// and less than a full batch waits for them.
    fn next_batch(&mut self, first: bool) -> Option<Vec<Job>> {
        self.jobs.retain(|j| !j.reply.is_closed());
        let retires = self.jobs.is_empty() || (!first && self.leaders > 1 && self.jobs.len() < MAX_BATCH);
        if retires {
            self.leaders -= 1;
            return None;
        }
        Some(take(&mut self.jobs))
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
        span_server: db::span::Server,
        canceller: db::connect::Canceller,
        notifier: Arc<Notifier>,
        metrics: IngestMetrics,
        deadline: Duration,
    ) -> Self {
        Self {
            queue: Mutex::default(),
            pool,
            span_server,
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
    fn push(&self, job: Job) -> (u64, bool) {
        self.queue.lock().expect("the batch queue's lock").push(job)
    }

    /// For a delivery that waited [`LINGER`]: see [`Queue::lead_for`].
    fn lead_for(&self, ticket: u64) -> Option<bool> {
        self.queue
            .lock()
            .expect("the batch queue's lock")
            .lead_for(ticket)
    }

    /// Removes a delivery that gives up before any batch took it.
    fn withdraw(&self, ticket: u64) -> bool {
        let mut queue = self.queue.lock().expect("the batch queue's lock");
        let before = queue.jobs.len();
        queue.jobs.retain(|j| j.ticket != ticket);
        queue.jobs.len() < before
    }

    /// See [`Queue::next_batch`].
    fn next_batch(&self, first: bool) -> Option<Vec<Job>> {
        self.queue
            .lock()
            .expect("the batch queue's lock")
            .next_batch(first)
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
        // A batch of one runs `record_event.sql`, as a lone payment does.
        let spans: Vec<tracing::Span> = jobs
            .iter()
            .map(|job| match size {
                1 => storage::record_span(&job.span, &self.span_server, &job.event),
                _ => storage::record_batch_span(&job.span, &self.span_server, size),
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
                    db::span::failed(span, &e);
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
                    db::span::timed_out(span);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A queued payment of `order` with event id `id`; the receiver keeps
    /// its request alive.
    fn job(id: &str, order: u32) -> (Job, oneshot::Receiver<Answer>) {
        let (reply, answer) = oneshot::channel();
        let body =
            format!(r#"{{"id":"{id}","type":"payment.succeeded","data":{{"payment_id":"pay_{order}"}}}}"#);
        let job = Job {
            ticket: 0,
            event: Arc::new(ProviderEvent::parse(body.as_bytes()).expect("a payment")),
            raw: body.into(),
            trace_context: String::new(),
            deadline: Instant::now() + Duration::from_secs(5),
            span: tracing::Span::none(),
            reply,
        };
        (job, answer)
    }

    fn ids(batch: &[Job]) -> Vec<&str> {
        batch.iter().map(|j| j.event.id.as_str()).collect()
    }

    #[test]
    fn the_first_payment_leads_and_the_next_wait_for_its_statement_until_a_full_batch_waits() {
        let mut queue = Queue::default();
        let mut answers = Vec::new();
        let (first, answer) = job("evt_0", 0);
        answers.push(answer);
        assert_eq!(queue.push(first), (1, true), "nobody leads: it does");
        assert_eq!(ids(&queue.next_batch(true).expect("its batch")), ["evt_0"]);
        // Its statement runs; what arrives meanwhile waits for it.
        for n in 1..MAX_BATCH {
            let (j, answer) = job(&format!("evt_{n}"), n as u32);
            answers.push(answer);
            assert!(!queue.push(j).1, "payment {n} waits for the running statement");
        }
        let (full, answer) = job("evt_8", 8);
        answers.push(answer);
        assert!(queue.push(full).1, "a full batch waits: one more leader");
        assert_eq!(queue.leaders, 2);
        let batch = queue.next_batch(true).expect("the new leader's batch");
        assert_eq!(batch.len(), MAX_BATCH);
        assert_eq!(ids(&batch)[0], "evt_1", "oldest first");
        let (late, answer) = job("evt_9", 9);
        answers.push(answer);
        assert!(!queue.push(late).1, "two leaders run: it waits for them");
        // The first leader's statement ends: one waits, another leader runs,
        // so it retires and leaves that one to it.
        assert!(queue.next_batch(false).is_none());
        assert_eq!(queue.leaders, 1);
        // The last leader takes whatever is left, then retires on an empty queue.
        assert_eq!(ids(&queue.next_batch(false).expect("the rest")), ["evt_9"]);
        assert!(queue.next_batch(false).is_none());
        assert_eq!(queue.leaders, 0);
        let (again, _answer) = job("evt_10", 10);
        assert!(queue.push(again).1, "idle again: the next payment leads at once");
    }

    #[test]
    fn a_lone_leader_takes_everything_that_arrived_during_its_statement() {
        let mut queue = Queue::default();
        let (first, _a) = job("evt_0", 0);
        assert!(queue.push(first).1);
        queue.next_batch(true).expect("its own batch");
        let mut answers = Vec::new();
        for n in 1..=3 {
            let (j, answer) = job(&format!("evt_{n}"), n);
            answers.push(answer);
            assert!(!queue.push(j).1);
        }
        assert_eq!(
            ids(&queue.next_batch(false).expect("the next batch")),
            ["evt_1", "evt_2", "evt_3"],
            "the only leader does not retire while anything waits"
        );
    }

    #[test]
    fn a_batch_never_holds_two_events_of_one_order_or_one_id_and_skips_gone_requests() {
        let mut queue = Queue::default();
        let (a, _a) = job("evt_a", 1);
        let (b, _b) = job("evt_b", 1);
        let (a_again, _c) = job("evt_a", 2);
        let (gone, gone_answer) = job("evt_gone", 3);
        let (d, _d) = job("evt_d", 4);
        for j in [a, b, a_again, gone, d] {
            queue.push(j);
        }
        drop(gone_answer);
        let batch = queue.next_batch(true).expect("a batch");
        assert_eq!(ids(&batch), ["evt_a", "evt_d"]);
        assert_eq!(
            queue.jobs.iter().map(|j| j.event.id.as_str()).collect::<Vec<_>>(),
            ["evt_b", "evt_a"],
            "kept in their order for the next batch; the gone request dropped"
        );
    }

    #[test]
    fn a_payment_that_waited_too_long_leads_only_from_the_queues_head() {
        let mut queue = Queue::default();
        let mut tickets = Vec::new();
        let mut answers = Vec::new();
        for n in 0..=MAX_BATCH {
            let (j, answer) = job(&format!("evt_{n}"), n as u32);
            answers.push(answer);
            tickets.push(queue.push(j).0);
        }
        // The first leader counted, its statement stuck (a lock wait, say):
        // nobody has taken anything yet.
        let leaders = queue.leaders;
        assert_eq!(queue.lead_for(tickets[0]), Some(true));
        assert_eq!(queue.leaders, leaders + 1);
        assert_eq!(
            queue.lead_for(tickets[MAX_BATCH]),
            Some(false),
            "a full batch is ahead of it: those lead"
        );
        queue.next_batch(true).expect("the new leader's batch");
        assert_eq!(queue.lead_for(tickets[0]), None, "taken: nothing to lead");
    }
}
