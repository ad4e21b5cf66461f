//! `LISTEN` on [`db::NOTIFY_CHANNEL`] on a connection of its own: each
//! notification (sent by the ingest after a commit that enqueued commands, in
//! a statement of its own, and by `dead requeue`) wakes the claimer at once,
//! so an idle relay sends a new row within milliseconds rather than at the
//! next poll.
//!
//! The connection is re-established whenever it drops (the relay keeps
//! polling meanwhile), and the claimer is woken after every (re)connection, so
//! notifications missed while disconnected cost at most one empty claim.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio::sync::Notify;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use crate::worker::LoopHealth;

pub async fn listen(
    database: db::Database,
    wake: Arc<Notify>,
    health: Arc<LoopHealth>,
    shutdown: CancellationToken,
) {
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        match listen_once(&database, &wake, &health, &shutdown).await {
            Ok(()) => failures = 0,
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(20) {
                    tracing::warn!(
                        error = format!("{e:#}"),
                        "LISTEN connection lost; polling until it is back"
                    );
                }
            }
        }
        health.listening.store(0, Ordering::Relaxed);
        let pause = Duration::from_millis(250 * u64::from(failures.clamp(1, 20)));
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.cancelled() => {}
        }
    }
}

async fn listen_once(
    database: &db::Database,
    wake: &Notify,
    health: &LoopHealth,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let (client, mut connection) = database.connect_raw("outbox-relay-listen").await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // The connection must be driven for the LISTEN to complete; its messages
    // are where notifications arrive.
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(_)) => {
                    if tx.send(()).is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    // LISTEN names its channel as an identifier, which no statement
    // parameter can stand for: the one definition is spliced in, quoted.
    client
        .batch_execute(&format!("LISTEN \"{}\"", db::NOTIFY_CHANNEL))
        .await?;
    health.listening.store(1, Ordering::Relaxed);
    // Anything enqueued while we were not listening: look now.
    wake.notify_one();
    loop {
        tokio::select! {
            got = rx.recv() => match got {
                Some(()) => wake.notify_one(),
                None => break,
            },
            _ = shutdown.cancelled() => {
                driver.abort();
                return Ok(());
            }
        }
    }
    match driver.await {
        Ok(Ok(())) => anyhow::bail!("LISTEN connection closed"),
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(e.into()),
    }
}
