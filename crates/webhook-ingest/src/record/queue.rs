//! The payments waiting for a leader ([`super::batch`]), and which of them
//! make the next batch.

use std::collections::{HashSet, VecDeque};

use tokio::sync::oneshot;

use super::statement::Received;
use crate::storage::Recorded;

/// The most deliveries one statement records. Eight already pay executor
/// start-up, the commit and the round trip once for eight; more would hold
/// more orders' locks for longer, and make a batch's failure costlier.
pub const MAX_BATCH: usize = 8;

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

/// A queued delivery.
pub(super) struct Job {
    pub(super) ticket: u64,
    pub(super) received: Received,
    /// The request's span: the parent of the statement's span.
    pub(super) span: tracing::Span,
    pub(super) reply: oneshot::Sender<Answer>,
}

#[derive(Default)]
pub(super) struct Queue {
    next_ticket: u64,
    pub(super) jobs: VecDeque<Job>,
    /// Leaders running (each recording a batch, or about to).
    pub(super) leaders: usize,
}

impl Queue {
    /// Queues `job`; its ticket, and whether its caller starts a leader
    /// (counted from here): when none runs, or when a full batch waits
    /// beyond what the running ones are taking.
    pub(super) fn push(&mut self, mut job: Job) -> (u64, bool) {
        self.next_ticket += 1;
        job.ticket = self.next_ticket;
        self.jobs.push_back(job);
        let lead = self.leaders == 0 || self.jobs.len() >= MAX_BATCH;
        if lead {
            self.leaders += 1;
        }
        (self.next_ticket, lead)
    }

    /// For a delivery that waited `LINGER` (the statements ahead are
    /// slow): `None` if it is no longer queued, else whether its caller
    /// starts one more leader (counted from here). Only a delivery within a
    /// batch of the queue's head does: those ahead of it waited longer, and
    /// started leaders of their own.
    pub(super) fn lead_for(&mut self, ticket: u64) -> Option<bool> {
        let position = self.jobs.iter().position(|j| j.ticket == ticket)?;
        let lead = position < MAX_BATCH;
        if lead {
            self.leaders += 1;
        }
        Some(lead)
    }

    /// Removes a delivery that gives up before any batch took it.
    pub(super) fn withdraw(&mut self, ticket: u64) -> bool {
        let before = self.jobs.len();
        self.jobs.retain(|j| j.ticket != ticket);
        self.jobs.len() < before
    }

    /// The next batch for a running leader (deliveries whose requests have
    /// gone are dropped first), or `None` when it retires (and is no longer
    /// counted): nothing is queued, or, after its `first` batch, others run
    /// and less than a full batch waits for them.
    pub(super) fn next_batch(&mut self, first: bool) -> Option<Vec<Job>> {
        self.jobs.retain(|j| !j.reply.is_closed());
        let retires = self.jobs.is_empty() || (!first && self.leaders > 1 && self.jobs.len() < MAX_BATCH);
        if retires {
            self.leaders -= 1;
            return None;
        }
        Some(take(&mut self.jobs))
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
        let event = &job.received.event;
        let payment = event.payment_id.as_deref();
        let fits = !ids.contains(event.id.as_str()) && payment.is_none_or(|p| !payments.contains(p));
        if fits {
            ids.insert(event.id.clone());
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use domain::ProviderEvent;
    use tokio::time::Instant;

    use super::*;

    /// A queued payment of `order` with event id `id`; the receiver keeps
    /// its request alive.
    fn job(id: &str, order: u32) -> (Job, oneshot::Receiver<Answer>) {
        let (reply, answer) = oneshot::channel();
        let body =
            format!(r#"{{"id":"{id}","type":"payment.succeeded","data":{{"payment_id":"pay_{order}"}}}}"#);
        let job = Job {
            ticket: 0,
            received: Received {
                event: Arc::new(ProviderEvent::parse(body.as_bytes()).expect("a payment")),
                raw: body.into(),
                trace_context: String::new(),
                deadline: Instant::now() + Duration::from_secs(5),
            },
            span: tracing::Span::none(),
            reply,
        };
        (job, answer)
    }

    fn ids(batch: &[Job]) -> Vec<&str> {
        batch.iter().map(|j| j.received.event.id.as_str()).collect()
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
            queue
                .jobs
                .iter()
                .map(|j| j.received.event.id.as_str())
                .collect::<Vec<_>>(),
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
