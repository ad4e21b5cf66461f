//! `webhook-ingest events list`: recorded events for an operator, typically
//! `--status unmatched` to reconcile payments no order matched.

use std::io::Write as _;

use domain::EventOutcome;
use process::terminal::printable;

use crate::storage::{self, EventRow};

pub async fn list(
    database: &db::Database,
    status: Option<&str>,
    json: bool,
    limit: i64,
) -> anyhow::Result<()> {
    let status = status
        .map(|s| {
            EventOutcome::parse(s).ok_or_else(|| {
                let known: Vec<_> = EventOutcome::ALL.iter().map(|o| o.as_str()).collect();
                anyhow::anyhow!("unknown status `{s}` ({})", known.join(", "))
            })
        })
        .transpose()?;
    let client = database.connect("webhook-ingest-cli").await?;
    let rows = storage::list_events(&client, status, limit).await?;
    let mut out = std::io::stdout().lock();
    if json {
        for row in &rows {
            serde_json::to_writer(&mut out, row)?;
            out.write_all(b"\n")?;
        }
    } else {
        write_table(&mut out, &rows)?;
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
        let at = r
            .processed_at
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let order = r.order_id.map(|o| o.to_string()).unwrap_or_else(|| "-".into());
        writeln!(
            out,
            "{:<32} {:<20} {:<15} {:<25} {:>10} {:>10}",
            printable(&r.event_id),
            printable(&r.event_type),
            r.status,
            at,
            r.deliveries,
            order
        )?;
    }
    if rows.is_empty() {
        writeln!(out, "(no events)")?;
    }
    Ok(())
}
