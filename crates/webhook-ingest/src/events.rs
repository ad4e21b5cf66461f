//! `webhook-ingest events list`, `events show` and `events replay`: recorded
//! events for an operator. `list` finds them (`--status unmatched` to reconcile payments no
//! order matched, `--id`, `--since`, pages with `--after`); `show` tells one
//! event's whole story from its id: every delivery's count and time, the
//! answer stored for them, its status and trace, and its order's commands
//! with their state, attempts and last error; `replay` applies an event
//! recorded `unmatched` to its order once the order exists.

use std::io::Write as _;
use std::time::Duration;

use domain::EventOutcome;
use process::terminal::{printable, shown_trace, utc_millis};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::settle::{self, Discard, Replay};
use crate::storage::{self, CommandRow, EventDetail, EventFilter, EventRow};

/// What `events list` was asked for, as typed.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub status: Option<EventOutcome>,
    /// An id, or a prefix followed by `*`.
    pub id: Option<String>,
    pub since: Option<Duration>,
    pub after: Option<String>,
    pub limit: i64,
}

impl Listing {
    fn filter(self) -> anyhow::Result<EventFilter> {
        let status = self.status;
        let (id, id_prefix) = match self.id {
            Some(id) => match id.strip_suffix('*') {
                Some(prefix) => (None, Some(prefix.to_owned())),
                None => (Some(id), None),
            },
            None => (None, None),
        };
        Ok(EventFilter {
            status,
            id,
            id_prefix,
            since: self.since,
            after: self.after,
            limit: self.limit,
        })
    }
}

pub async fn list(database: &db::Database, listing: Listing, json: bool) -> anyhow::Result<()> {
    let filter = listing.filter()?;
    let client = database.connect("webhook-ingest-cli").await?;
    if let Some(after) = &filter.after
        && storage::show_event(&client, after).await?.is_none()
    {
        anyhow::bail!(
            "no event `{}` to list after (never recorded, or removed by retention)",
            printable(after)
        );
    }
    let rows = storage::list_events(&client, &filter).await?;
    let mut out = std::io::stdout().lock();
    if json {
        for row in &rows {
            serde_json::to_writer(&mut out, row)?;
            out.write_all(b"\n")?;
        }
    } else {
        write_table(&mut out, &rows)?;
        if let Some(last) = rows.last().filter(|_| rows.len() as i64 == filter.limit) {
            writeln!(
                out,
                "(at most {} shown; the next page: --after {})",
                filter.limit,
                printable(&last.event_id)
            )?;
        }
    }
    Ok(())
}

fn write_table(out: &mut impl std::io::Write, rows: &[EventRow]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<32} {:<20} {:<15} {:<25} {:>10} {:>10}",
        "EVENT_ID", "EVENT_TYPE", "STATUS", "PROCESSED_AT", "DELIVERIES", "ORDER_ID"
    )?;
    for r in rows {
        let order = r.order_id.map(|o| o.to_string()).unwrap_or_else(|| "-".into());
        writeln!(
            out,
            "{:<32} {:<20} {:<15} {:<25} {:>10} {:>10}",
            printable(&r.event_id),
            printable(&r.event_type),
            r.status,
            utc_millis(r.processed_at),
            r.deliveries,
            order
        )?;
    }
    if rows.is_empty() {
        writeln!(out, "(no events)")?;
    }
    Ok(())
}

pub async fn show(database: &db::Database, id: &str, json: bool) -> anyhow::Result<()> {
    let client = database.connect("webhook-ingest-cli").await?;
    let Some(event) = storage::show_event(&client, id).await? else {
        anyhow::bail!(
            "no event `{}` recorded (never delivered here, or removed by retention after RETENTION_DAYS)",
            printable(id)
        );
    };
    let commands = match event.order_id {
        Some(order) => storage::order_commands(&client, order).await?,
        None => Vec::new(),
    };
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut out, &story_json(&event, &commands))?;
        out.write_all(b"\n")?;
    } else {
        write_story(&mut out, &event, &commands)?;
    }
    Ok(())
}

/// The trace id of a stored `traceparent`, if it is a valid one.
fn trace_id(event: &EventDetail) -> Option<&str> {
    event
        .trace_context
        .as_deref()
        .and_then(process::traces::parse_traceparent)
        .map(|(trace_id, _)| trace_id)
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&Rfc3339).unwrap_or_default()
}

/// Text that should be JSON, as a JSON value; kept as a string if it is not.
fn json_value(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|_| text.into())
}

fn story_json(event: &EventDetail, commands: &[CommandRow]) -> serde_json::Value {
    let commands: Vec<serde_json::Value> = commands
        .iter()
        .map(|c| {
            serde_json::json!({
                "id": c.id,
                "kind": c.kind,
                "idempotency_key": c.idempotency_key,
                "event_id": c.event_id,
                "status": c.status,
                "attempts": c.attempts,
                "last_error": c.last_error,
                "created_at": rfc3339(c.created_at),
                "available_at": rfc3339(c.available_at),
                "finished_at": c.finished_at.map(rfc3339),
                "lease_owner": c.lease_owner,
                "leased_until": c.leased_until.map(rfc3339),
            })
        })
        .collect();
    serde_json::json!({
        "event_id": event.event_id,
        "event_type": event.event_type,
        "status": event.status.as_str(),
        "order_id": event.order_id,
        "deliveries": event.deliveries,
        "processed_at": rfc3339(event.processed_at),
        "last_delivered_at": rfc3339(event.last_delivered_at),
        "result": json_value(&event.result),
        "payload": event.payload.as_deref().map(json_value),
        "trace_context": event.trace_context,
        "trace_id": trace_id(event),
        "discarded_reason": event.discarded.as_ref().map(|(reason, _)| reason),
        "discarded_at": event.discarded.as_ref().map(|(_, at)| rfc3339(*at)),
        "commands": commands,
    })
}

fn write_story(
    out: &mut impl std::io::Write,
    event: &EventDetail,
    commands: &[CommandRow],
) -> std::io::Result<()> {
    let order = event
        .order_id
        .map_or_else(|| "- (no order matched)".to_owned(), |o| o.to_string());
    writeln!(out, "event        {}", printable(&event.event_id))?;
    writeln!(out, "type         {}", printable(&event.event_type))?;
    writeln!(out, "status       {}", event.status)?;
    writeln!(out, "order        {order}")?;
    writeln!(
        out,
        "deliveries   {}: first {}, last {}",
        event.deliveries,
        utc_millis(event.processed_at),
        utc_millis(event.last_delivered_at)
    )?;
    writeln!(
        out,
        "trace        {}",
        shown_trace(event.trace_context.as_deref())
    )?;
    writeln!(out, "answer       {}", printable(&event.result))?;
    if let Some((reason, at)) = &event.discarded {
        writeln!(
            out,
            "discarded    {} by an operator: {}",
            utc_millis(*at),
            printable(reason)
        )?;
    }
    let Some(order_id) = event.order_id else {
        return writeln!(out, "commands     none: no order matched the event's payment");
    };
    if commands.is_empty() {
        return writeln!(
            out,
            "commands     none for order {order_id} (none enqueued, or removed by retention)"
        );
    }
    writeln!(out, "commands of order {order_id}:")?;
    writeln!(
        out,
        "  {:<8} {:<18} {:<9} {:>8}  {:<24} {:<32} {:<28} LAST_ERROR",
        "ID", "KIND", "STATUS", "ATTEMPTS", "CREATED", "ENQUEUED_BY", "FINISHED / NEXT"
    )?;
    for c in commands {
        let when = match (&c.finished_at, &c.lease_owner, &c.leased_until) {
            (Some(finished), _, _) => utc_millis(*finished),
            (None, Some(owner), Some(until)) => {
                format!("held by {} until {}", printable(owner), utc_millis(*until))
            }
            (None, _, _) => format!("due {}", utc_millis(c.available_at)),
        };
        writeln!(
            out,
            "  {:<8} {:<18} {:<9} {:>8}  {:<24} {:<32} {:<28} {}",
            c.id,
            printable(&c.kind),
            c.status,
            c.attempts,
            utc_millis(c.created_at),
            printable(&c.event_id),
            when,
            c.last_error
                .as_deref()
                .map_or(std::borrow::Cow::Borrowed("-"), printable)
        )?;
    }
    Ok(())
}

/// `events replay <id>`: an event recorded `unmatched` applied to its order
/// now that one has its payment id ([`settle::replay`]). Exit 0 when it was
/// applied, or had been already (by an earlier or a racing replay: nothing
/// changes twice); 1 when it cannot be (not recorded, never matchable, or
/// still no order).
pub async fn replay(database: &db::Database, id: &str, json: bool) -> anyhow::Result<()> {
    let client = database.connect("webhook-ingest-cli").await?;
    let outcome = settle::replay(&client, id).await?;
    let mut out = std::io::stdout().lock();
    match outcome {
        Replay::NotRecorded => anyhow::bail!(
            "no event `{}` recorded (never delivered here, or removed by retention after RETENTION_DAYS)",
            printable(id)
        ),
        Replay::Unchanged(event) => unchanged(&mut out, &event, json),
        Replay::NoStoredEvent => anyhow::bail!("`{}` has no stored event to replay", printable(id)),
        Replay::NoPaymentId => anyhow::bail!(
            "`{}` has no data.payment_id: no order can ever match it",
            printable(id)
        ),
        Replay::StillNoOrder { payment_id } => anyhow::bail!(
            "no order has payment id `{}` yet: nothing changed; replay `{}` once the order exists",
            printable(&payment_id),
            printable(id)
        ),
        Replay::Replayed { event_id, replayed } => {
            if json {
                serde_json::to_writer(
                    &mut out,
                    &serde_json::json!({
                        "event_id": event_id,
                        "replayed": true,
                        "status": replayed.status.as_str(),
                        "order_id": replayed.order_id,
                        "enqueued": replayed.enqueued,
                        "result": json_value(&replayed.body),
                    }),
                )?;
                out.write_all(b"\n")?;
            } else {
                writeln!(
                    out,
                    "replayed {}: {}, order {}, {} command(s) enqueued; later deliveries are answered {}",
                    printable(&event_id),
                    replayed.status,
                    replayed.order_id,
                    replayed.enqueued,
                    printable(&replayed.body)
                )?;
            }
            Ok(())
        }
    }
}

/// What `replay` says of an event that is not (or no longer) `unmatched`.
fn unchanged(out: &mut impl std::io::Write, event: &EventDetail, json: bool) -> anyhow::Result<()> {
    if json {
        serde_json::to_writer(
            &mut *out,
            &serde_json::json!({
                "event_id": event.event_id,
                "replayed": false,
                "status": event.status.as_str(),
                "order_id": event.order_id,
                "enqueued": 0,
                "result": json_value(&event.result),
            }),
        )?;
        out.write_all(b"\n")?;
    } else {
        let order = event
            .order_id
            .map_or_else(String::new, |o| format!(" (order {o})"));
        writeln!(
            out,
            "unchanged: {} is {}{order}; only an unmatched event is replayed, once",
            printable(&event.event_id),
            event.status
        )?;
    }
    Ok(())
}

/// `events discard <id> --reason <why>`: an event recorded `unmatched` that
/// will never match is marked `discarded` with the reason, once
/// ([`settle::discard`]). Exit 0 when it was discarded, or had been already;
/// 1 when it is not recorded, or was applied to an order (then nothing is
/// discarded: the order's state is what it is).
pub async fn discard(database: &db::Database, id: &str, reason: &str, json: bool) -> anyhow::Result<()> {
    let client = database.connect("webhook-ingest-cli").await?;
    let (event, now) = match settle::discard(&client, id, reason).await? {
        Discard::NotRecorded => anyhow::bail!(
            "no event `{}` recorded (never delivered here, or removed by retention after RETENTION_DAYS)",
            printable(id)
        ),
        Discard::NotUnmatched(event) => anyhow::bail!(
            "not discarded: {} is {}{}; only an unmatched event is discarded",
            printable(&event.event_id),
            event.status,
            event
                .order_id
                .map_or_else(String::new, |o| format!(" (order {o})"))
        ),
        Discard::Discarded(event) => (event, true),
        Discard::AlreadyDiscarded(event) => (event, false),
    };
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(
            &mut out,
            &serde_json::json!({
                "event_id": event.event_id,
                "discarded": now,
                "status": event.status.as_str(),
                "discarded_reason": event.discarded.as_ref().map(|(reason, _)| reason),
                "discarded_at": event.discarded.as_ref().map(|(_, at)| rfc3339(*at)),
            }),
        )?;
        out.write_all(b"\n")?;
    } else if let Some((_, at)) = event.discarded.as_ref().filter(|_| now) {
        writeln!(
            out,
            "discarded {} at {}: it is kept, no longer applied by itself or alerted on",
            printable(&event.event_id),
            utc_millis(*at)
        )?;
    } else {
        writeln!(
            out,
            "unchanged: {} was discarded already",
            printable(&event.event_id)
        )?;
    }
    Ok(())
}
