//! A record statement on a pooled connection, under a delivery's deadline:
//! a lone delivery's (`record_event.sql` and its kin) or a batch's
//! (`record_events_batch.sql`). A statement the deadline passes is not left
//! to run unwatched ([`Statements::abandon`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use domain::ProviderEvent;
use tokio::time::{Instant, timeout_at};
use tokio_postgres::CancelToken;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::deadline::Deadline;
use crate::metrics::IngestMetrics;
use crate::notifier::Notifier;
use crate::storage::{self, Pending, Recorded};

/// A verified delivery on its way to the database.
#[derive(Debug, Clone)]
pub struct Received {
    pub event: Arc<ProviderEvent>,
    /// The body as it arrived: the stored payload.
    pub raw: Arc<str>,
    /// The `traceparent` its outbox rows continue.
    pub trace_context: String,
    /// When the provider is answered 503 if nothing else answered it.
    pub deadline: Instant,
}

/// A statement's answer, or nothing when the deadline abandoned it.
pub(super) type Answered<T> = Option<Result<T, tokio_postgres::Error>>;

/// What every record statement needs: its connections, where its spans say
/// it goes, how to cancel it, whom to wake after it enqueued, its counters.
pub(super) struct Statements {
    pub(super) pool: db::Pool,
    span_server: db::span::Server,
    canceller: db::Canceller,
    notifier: Arc<Notifier>,
    pub(super) metrics: IngestMetrics,
    pub(super) deadline: Deadline,
}

impl Statements {
    pub(super) fn new(
        database: &db::Database,
        pool: db::Pool,
        notifier: Arc<Notifier>,
        metrics: IngestMetrics,
        deadline: Deadline,
    ) -> Self {
        Self {
            pool,
            span_server: database.span_server(),
            canceller: database.canceller(),
            notifier,
            metrics,
            deadline,
        }
    }

    /// Wakes the relays: something was enqueued.
    pub(super) fn notify(&self) {
        self.notifier.notify();
    }

    /// The client span of a lone delivery's statement, under `parent`.
    pub(super) fn alone_span(&self, parent: &tracing::Span, event: &ProviderEvent) -> tracing::Span {
        storage::record_span(parent, &self.span_server, event)
    }

    /// The client span of a batch's statement for one of its `size`
    /// deliveries, under that delivery's span `parent`.
    pub(super) fn batch_span(&self, parent: &tracing::Span, size: usize) -> tracing::Span {
        storage::record_batch_span(parent, &self.span_server, size)
    }

    /// One delivery's statement on `client`, in `span` (its client span, as
    /// far as the delivery waits for it), under its deadline: `None` when
    /// the deadline abandoned it, else its own answer.
    pub(super) async fn alone(
        &self,
        client: db::Client,
        received: &Received,
        span: &tracing::Span,
    ) -> Answered<Recorded> {
        let owned = received.clone();
        let statement = move |client: InFlight| async move {
            let result =
                storage::record_event(client.get(), &owned.event, &owned.raw, Some(&owned.trace_context))
                    .await;
            (client.answered(), result)
        };
        let answered = self
            .run(client, statement, received.deadline, span, &received.event.id)
            .await;
        match &answered {
            None => db::span::timed_out(span),
            Some(Err(e)) => db::span::failed(span, e),
            Some(Ok(_)) => {}
        }
        answered
    }

    /// A batch's statement on `client`, in the first delivery's span, under
    /// the batch's earliest `deadline`: a row for each delivery (`None`
    /// where its order was locked by someone else), or nothing when the
    /// deadline abandoned it.
    pub(super) async fn batch(
        &self,
        client: db::Client,
        batch: Vec<Received>,
        deadline: Instant,
        span: &tracing::Span,
    ) -> Answered<Vec<Option<Recorded>>> {
        let what = format!("{} and {} more", batch[0].event.id, batch.len() - 1);
        let statement = move |client: InFlight| async move {
            let pending: Vec<Pending<'_>> = batch
                .iter()
                .map(|received| Pending {
                    event: &received.event,
                    raw_body: &received.raw,
                    trace_context: &received.trace_context,
                })
                .collect();
            let result = storage::record_events(client.get(), &pending).await;
            drop(pending);
            (client.answered(), result)
        };
        self.run(client, statement, deadline, span, &what).await
    }

    /// `statement` on `client` until `deadline`; past it, abandoned (see
    /// [`Statements::abandon`]) and `None`.
    async fn run<T, F>(
        &self,
        client: db::Client,
        statement: impl FnOnce(InFlight) -> F,
        deadline: Instant,
        span: &tracing::Span,
        what: &str,
    ) -> Answered<T>
    where
        F: Future<Output = (db::Client, Result<T, tokio_postgres::Error>)> + Send + 'static,
        T: Landed + Send + 'static,
    {
        // Taken now: once the statement is sent, its connection belongs to it.
        let session = self.canceller.session_of(&client);
        let mut recording = Box::pin(statement(InFlight(Some(client))));
        match timeout_at(deadline, &mut recording)
            .instrument(span.clone())
            .await
        {
            // Its statement has answered: the connection goes back to the pool clean.
            Ok((_client, result)) => Some(result),
            Err(_) => {
                self.abandon(recording, session, what)
                    .instrument(span.clone())
                    .await;
                None
            }
        }
    }

    /// The deadline passed with a record statement still running. Dropping
    /// it would not stop it: the server would run it on and might commit
    /// after the provider was told to retry; closing its connection would
    /// stop it only at the server's next check for a vanished client, if it
    /// makes any (see `db::Canceller`). So the server is asked to
    /// cancel it, and the answer waits for it to end, up to the deadline's
    /// cancel grace; the rest goes on in the background. There, the
    /// statement gets one more deadline to end (`statement_timeout`, the
    /// server's own backstop, ends it if the cancel was lost), its fate is
    /// logged, and its connection is discarded, never handed to another
    /// request while a cancel may still be on its way to its session.
    ///
    /// A commit that wins the race is not an error: the provider's retry
    /// finds the claim and is answered with the stored result
    /// (`Idempotent-Replayed`).
    async fn abandon<F, T>(&self, recording: Pin<Box<F>>, session: CancelToken, what: &str)
    where
        F: Future<Output = (db::Client, Result<T, tokio_postgres::Error>)> + Send + 'static,
        T: Landed + Send + 'static,
    {
        let (ended, ended_rx) = tokio::sync::oneshot::channel::<()>();
        let canceller = self.canceller.clone();
        let notifier = self.notifier.clone();
        let wait = self.deadline.whole();
        // Its own span (the request's ends with the 503), in the event's trace.
        let span = tracing::info_span!(parent: None, "cancel_abandoned_statement", webhook.event_id = what);
        let _ = span.set_parent(tracing::Span::current().context());
        let background = async move {
            let statement = async move {
                let answered = tokio::time::timeout(wait, recording).await;
                let _ = ended.send(());
                answered
            };
            let (cancelled, answered) = tokio::join!(canceller.cancel(&session), statement);
            if let Err(e) = cancelled {
                tracing::warn!(error = %e, "could not send the cancel request; statement_timeout bounds the statement");
            }
            match answered {
                Ok((client, Ok(recorded))) => {
                    tracing::warn!(
                        claimed = recorded.claimed(),
                        "the statement committed after all (the cancel came too late): the provider's retry will be answered with the stored result"
                    );
                    if recorded.enqueued() > 0 {
                        notifier.notify();
                    }
                    client.discard();
                }
                Ok((client, Err(e))) => {
                    match e.as_db_error() {
                        Some(refused) => tracing::info!(
                            error = %refused,
                            "the statement ended without committing (cancelled): nothing written"
                        ),
                        None => tracing::warn!(
                            error = %e,
                            "the connection failed under the statement: a retry is answered whether or not it committed"
                        ),
                    }
                    client.discard();
                }
                // The future is dropped here, and `InFlight` discards its connection.
                Err(_) => tracing::warn!(
                    "the statement did not end within another deadline; its connection is discarded"
                ),
            }
        };
        tokio::spawn(background.instrument(span));
        let _ = tokio::time::timeout(self.deadline.cancel_grace(), ended_rx).await;
    }
}

/// What an abandoned statement that committed after all wrote, for its log
/// line and the relays' wake-up.
pub(super) trait Landed {
    /// Deliveries it claimed (first deliveries).
    fn claimed(&self) -> usize;
    /// Commands it enqueued.
    fn enqueued(&self) -> i32;
}

impl Landed for Recorded {
    fn claimed(&self) -> usize {
        usize::from(self.delivery != storage::Delivery::Replay)
    }

    fn enqueued(&self) -> i32 {
        Recorded::enqueued(self)
    }
}

impl Landed for Vec<Option<Recorded>> {
    fn claimed(&self) -> usize {
        self.iter().flatten().map(Landed::claimed).sum()
    }

    fn enqueued(&self) -> i32 {
        self.iter().flatten().map(Recorded::enqueued).sum()
    }
}

/// A pooled connection with a statement in flight. Dropped before the
/// statement answered, it is discarded rather than returned to the pool busy
/// with a statement nobody waits for.
pub(super) struct InFlight(Option<db::Client>);

impl InFlight {
    fn get(&self) -> &db::Client {
        self.0.as_ref().expect("only `answered` takes the connection")
    }

    fn answered(mut self) -> db::Client {
        self.0.take().expect("only `answered` takes the connection")
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            client.discard();
        }
    }
}
