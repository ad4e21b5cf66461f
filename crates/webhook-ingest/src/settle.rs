//! Settling an `unmatched` event, as `events replay` and `events discard`
//! do it and as the operator's console does: each returns what happened,
//! and its caller says it in its own form (a line, JSON, a page). The
//! guards live in the statements (`replay_event.sql` applies only an event
//! still `unmatched` under its row lock, `discard_event.sql` discards only
//! one), so the CLI, the console and the reconciler racing for one event
//! change it once.

use domain::EventOutcome;

use crate::storage::{self, EventDetail, Replayed};

/// What `replay` did.
#[derive(Debug, Clone)]
pub enum Replay {
    /// No event recorded under the id (never delivered, or removed by retention).
    NotRecorded,
    /// The event is not, or is no longer, `unmatched`: nothing changed
    /// (replayed already, by this or a racing replay, applied, discarded).
    Unchanged(EventDetail),
    /// The stored event cannot be parsed again (none stored, or another's).
    NoStoredEvent,
    /// It has no `data.payment_id`: no order can ever match it.
    NoPaymentId,
    /// No order has its payment id yet: nothing changed.
    StillNoOrder { payment_id: String },
    /// Applied to its order now.
    Replayed { event_id: String, replayed: Replayed },
}

/// Applies the event recorded `unmatched` under `id` to the order that now
/// has its payment id, once; the relays are woken when it enqueued commands.
pub async fn replay(client: &impl db::Executor, id: &str) -> anyhow::Result<Replay> {
    let Some(event) = storage::show_event(client, id).await? else {
        return Ok(Replay::NotRecorded);
    };
    if event.status != EventOutcome::Unmatched {
        return Ok(Replay::Unchanged(event));
    }
    let Some(parsed) = storage::stored_event(&event.event_id, event.payload.as_deref()) else {
        return Ok(Replay::NoStoredEvent);
    };
    let Some(payment_id) = parsed.payment_id.clone() else {
        return Ok(Replay::NoPaymentId);
    };
    if let Some(replayed) = storage::replay_event(client, &parsed).await? {
        if replayed.enqueued > 0 {
            // The rows are committed; a lost NOTIFY costs a poll interval.
            let _ = storage::wake_relays(client).await;
        }
        return Ok(Replay::Replayed {
            event_id: event.event_id,
            replayed,
        });
    }
    // Nothing applied: replayed meanwhile, or still no order.
    match storage::show_event(client, id).await? {
        Some(now) if now.status != EventOutcome::Unmatched => Ok(Replay::Unchanged(now)),
        _ => Ok(Replay::StillNoOrder { payment_id }),
    }
}

/// What `discard` did.
#[derive(Debug, Clone)]
pub enum Discard {
    NotRecorded,
    /// Discarded now, by this call.
    Discarded(EventDetail),
    /// Discarded before (by another operator, or an earlier try).
    AlreadyDiscarded(EventDetail),
    /// Not discarded: it is not `unmatched` (applied to an order, or ignored).
    NotUnmatched(EventDetail),
}

/// Marks the event recorded `unmatched` under `id` as `discarded` with
/// `reason`, once.
pub async fn discard(client: &impl db::Executor, id: &str, reason: &str) -> anyhow::Result<Discard> {
    let discarded_at = storage::discard_event(client, id, reason).await?;
    let Some(event) = storage::show_event(client, id).await? else {
        return Ok(Discard::NotRecorded);
    };
    Ok(match (event.status, discarded_at) {
        (EventOutcome::Discarded, Some(_)) => Discard::Discarded(event),
        (EventOutcome::Discarded, None) => Discard::AlreadyDiscarded(event),
        _ => Discard::NotUnmatched(event),
    })
}
