//! The operator's commands: `dead list`, `dead show`, `dead requeue`,
//! `dead discard`, `stats`, `prune`, `audit`.
//! Tables for people, `--json` (one object per line) for scripts; a long
//! command's progress on stderr. Text from the database goes through
//! [`printable`] in the tables (serde escapes it in the JSON).

use std::io::Write as _;
use std::time::{Duration, Instant};

use process::terminal::{self, printable, shown_trace, utc_millis};

use crate::storage;

/// `dead list`: a page of dead rows, oldest first, and where the next starts.
pub async fn dead_list(
    database: &db::Database,
    filter: &storage::DeadFilter,
    json: bool,
) -> anyhow::Result<()> {
    let client = database.connect("outbox-relay-cli").await?;
    let page = storage::dead_rows(&client, filter).await?;
    let mut out = std::io::stdout().lock();
    if json {
        for row in &page.rows {
            serde_json::to_writer(&mut out, row)?;
            out.write_all(b"\n")?;
        }
        return Ok(());
    }
    let of_kind = filter
        .kind
        .as_deref()
        .map_or_else(String::new, |k| format!(" of kind {}", printable(k)));
    if page.rows.is_empty() {
        writeln!(out, "(no dead rows{of_kind})")?;
        return Ok(());
    }
    writeln!(
        out,
        "{:>10} {:<20} {:<24} {:<28} {:>8} {:>6}  LAST_ERROR",
        "ID", "KIND", "IDEMPOTENCY_KEY", "EVENT", "ATTEMPTS", "AGE"
    )?;
    for r in &page.rows {
        writeln!(
            out,
            "{:>10} {:<20} {:<24} {:<28} {:>8} {:>6}  {}",
            r.id,
            printable(&r.kind),
            printable(&r.idempotency_key),
            printable(&r.event_id),
            r.attempts,
            terminal::age(r.age_seconds),
            printable(r.last_error.as_deref().unwrap_or("-"))
        )?;
    }
    let shown = page.rows.len();
    if let Some(last) = page.rows.last().filter(|_| shown as i64 == filter.limit) {
        writeln!(
            out,
            "({shown} shown, {} dead{of_kind} in all; the next page: --after {})",
            page.total, last.id
        )?;
    } else {
        writeln!(out, "({} dead{of_kind} in all)", page.total)?;
    }
    Ok(())
}

/// `dead show <id>`: one outbox row, whole.
pub async fn dead_show(database: &db::Database, id: i64, json: bool) -> anyhow::Result<()> {
    let client = database.connect("outbox-relay-cli").await?;
    let Some(row) = storage::outbox_row(&client, id).await? else {
        anyhow::bail!("no outbox row {id} (never enqueued, or removed by retention after RETENTION_DAYS)");
    };
    let trace_id = row
        .trace_context
        .as_deref()
        .and_then(process::traces::parse_traceparent)
        .map(|(trace_id, _)| trace_id.to_owned());
    let mut out = std::io::stdout().lock();
    if json {
        let mut value = serde_json::to_value(&row)?;
        value["payload"] = serde_json::from_str(&row.payload).unwrap_or_else(|_| row.payload.clone().into());
        value["trace_id"] = trace_id.into();
        serde_json::to_writer(&mut out, &value)?;
        out.write_all(b"\n")?;
        return Ok(());
    }
    writeln!(out, "row          {}", row.id)?;
    writeln!(out, "kind         {}", printable(&row.kind))?;
    writeln!(out, "key          {}", printable(&row.idempotency_key))?;
    writeln!(out, "status       {}", printable(&row.status))?;
    writeln!(out, "order        {}", row.order_id)?;
    writeln!(out, "event        {} (enqueued it)", printable(&row.event_id))?;
    writeln!(out, "attempts     {} (claims {})", row.attempts, row.claims)?;
    writeln!(
        out,
        "last error   {}",
        printable(row.last_error.as_deref().unwrap_or("-"))
    )?;
    writeln!(out, "created      {}", utc_millis(row.created_at))?;
    match (row.finished_at, &row.lease_owner, row.leased_until) {
        (Some(finished), _, _) => writeln!(out, "finished     {}", utc_millis(finished))?,
        (None, Some(owner), Some(until)) => writeln!(
            out,
            "held by      {} until {}",
            printable(owner),
            utc_millis(until)
        )?,
        (None, _, _) => writeln!(out, "due          {}", utc_millis(row.available_at))?,
    }
    writeln!(out, "trace        {}", shown_trace(row.trace_context.as_deref()))?;
    writeln!(out, "payload      {}", printable(&row.payload))?;
    Ok(())
}

/// `dead requeue`: dead rows back to pending; prints each one it put back
/// (with `dry_run`, would put back, changing nothing).
pub async fn dead_requeue(
    database: &db::Database,
    filter: &storage::RequeueFilter,
    json: bool,
) -> anyhow::Result<()> {
    let client = database.connect("outbox-relay-cli").await?;
    let rows = storage::requeue_dead(&client, filter).await?;
    if let (Some(id), true) = (filter.id, rows.is_empty()) {
        let status = storage::outbox_row(&client, id).await?.map(|r| r.status);
        match status {
            Some(status) => anyhow::bail!("row {id} is {}, not dead: nothing changed", printable(&status)),
            None => anyhow::bail!("no outbox row {id}: nothing changed"),
        }
    }
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(
            &mut out,
            &serde_json::json!({"dry_run": filter.dry_run, "count": rows.len(), "rows": rows}),
        )?;
        out.write_all(b"\n")?;
        return Ok(());
    }
    let verb = if filter.dry_run {
        "would requeue"
    } else {
        "requeued"
    };
    for r in &rows {
        writeln!(
            out,
            "{verb} {} {} {} (after {} attempts; last error: {})",
            r.id,
            printable(&r.kind),
            printable(&r.idempotency_key),
            r.attempts,
            printable(r.last_error.as_deref().unwrap_or("-"))
        )?;
    }
    if filter.dry_run {
        writeln!(
            out,
            "dry run: {} row(s) would be requeued; nothing changed",
            rows.len()
        )?;
    } else {
        writeln!(
            out,
            "requeued {} row(s): pending, due now, attempts reset",
            rows.len()
        )?;
    }
    Ok(())
}

/// `dead discard <id> --reason`: a dead row ended as cancelled, kept with the
/// reason until retention.
pub async fn dead_discard(database: &db::Database, id: i64, reason: &str, json: bool) -> anyhow::Result<()> {
    let client = database.connect("outbox-relay-cli").await?;
    let Some(row) = storage::discard_dead(&client, id, reason).await? else {
        match storage::outbox_row(&client, id).await? {
            Some(row) => anyhow::bail!(
                "row {id} is {}, not dead: nothing changed",
                printable(&row.status)
            ),
            None => anyhow::bail!("no outbox row {id}: nothing changed"),
        }
    };
    let mut out = std::io::stdout().lock();
    if json {
        let mut value = serde_json::to_value(&row)?;
        value["status"] = "cancelled".into();
        serde_json::to_writer(&mut out, &value)?;
        out.write_all(b"\n")?;
        return Ok(());
    }
    writeln!(
        out,
        "discarded {} {} {} (order {}, event {}, after {} attempts): dead -> cancelled, kept until retention; last error now: {}",
        row.id,
        printable(&row.kind),
        printable(&row.idempotency_key),
        row.order_id,
        printable(&row.event_id),
        row.attempts,
        printable(row.last_error.as_deref().unwrap_or("-"))
    )?;
    Ok(())
}

#[derive(serde::Serialize)]
struct Stats {
    by_status_and_kind: Vec<storage::StatusKindCount>,
    pending: i64,
    due: i64,
    dead: i64,
    /// `null` with nothing pending: no row has an age.
    oldest_pending_age_seconds: Option<f64>,
}

pub async fn stats(database: &db::Database, json: bool) -> anyhow::Result<()> {
    let client = database.connect("outbox-relay-cli").await?;
    let by_status_and_kind = storage::counts_by_status_and_kind(&client).await?;
    let backlog = storage::backlog(&client).await?;
    let stats = Stats {
        by_status_and_kind,
        pending: backlog.pending,
        due: storage::backlog_due(&client).await?,
        dead: backlog.dead,
        oldest_pending_age_seconds: (backlog.pending > 0).then_some(backlog.oldest_pending_age_seconds),
    };
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut out, &stats)?;
        out.write_all(b"\n")?;
        return Ok(());
    }
    writeln!(out, "{:<10} {:<20} {:>10}", "STATUS", "KIND", "ROWS")?;
    for s in &stats.by_status_and_kind {
        writeln!(
            out,
            "{:<10} {:<20} {:>10}",
            printable(&s.status),
            printable(&s.kind),
            s.count
        )?;
    }
    writeln!(out)?;
    writeln!(out, "pending: {} (due now: {})", stats.pending, stats.due)?;
    writeln!(out, "dead: {}", stats.dead)?;
    let oldest = stats
        .oldest_pending_age_seconds
        .map_or_else(|| "-".to_owned(), terminal::age);
    writeln!(out, "oldest pending: {oldest}")?;
    Ok(())
}

/// `prune`'s summary, as `--json` prints it.
#[derive(serde::Serialize)]
struct PruneSummary {
    /// False when another replica held the prune lock: nothing was done.
    ran: bool,
    outbox_rows: u64,
    processed_events: u64,
    batches: u64,
    retention_days: u32,
    elapsed_secs: f64,
    /// How the prune's WAL full-page images were compressed; `null`: the
    /// server's `wal_compression` applied.
    wal_compression: Option<&'static str>,
}

/// `prune`: a line on stderr every `progress_every` while it deletes (a
/// backlog of millions of rows takes minutes at [`storage::PRUNE_BATCH`]
/// rows per statement, at half duty), then the summary on stdout.
pub async fn prune(
    database: &db::Database,
    retention_days: u32,
    progress_every: Duration,
    json: bool,
) -> anyhow::Result<()> {
    let client = database.connect_with(&storage::prune_connect_options()).await?;
    let started = Instant::now();
    let mut last_line = started;
    let pruned = storage::prune_reporting(&client, retention_days, |progress| {
        let now = Instant::now();
        if now.duration_since(last_line) >= progress_every {
            last_line = now;
            eprintln!("{}", prune_progress_line(progress, started.elapsed()));
        }
    })
    .await?;
    let summary = PruneSummary {
        ran: pruned.ran,
        outbox_rows: pruned.outbox_rows,
        processed_events: pruned.processed_events,
        batches: pruned.batches,
        retention_days,
        elapsed_secs: (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
        wal_compression: pruned.wal_compression,
    };
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut out, &summary)?;
        out.write_all(b"\n")?;
        return Ok(());
    }
    if !summary.ran {
        writeln!(out, "another replica is pruning right now; nothing done")?;
        return Ok(());
    }
    let wal = match summary.wal_compression {
        Some(method) => format!("its WAL's full-page images compressed with {method}"),
        None => {
            "the server's wal_compression setting applied (this role may not set it: deploy/sql/roles.sql)"
                .to_owned()
        }
    };
    writeln!(
        out,
        "pruned {} outbox row(s) and {} processed event(s) older than {retention_days} day(s) \
         in {:.1} s ({} batch(es)); {wal}",
        summary.outbox_rows, summary.processed_events, summary.elapsed_secs, summary.batches
    )?;
    Ok(())
}

/// `prune 12.3s: outbox 48000 row(s), processed_events 0, 193 batch(es),
/// 3902 rows/s; deleting from outbox`.
fn prune_progress_line(p: &storage::PruneProgress, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = (p.outbox_rows + p.processed_events) as f64 / secs.max(1e-3);
    format!(
        "prune {secs:.1}s: outbox {} row(s), processed_events {}, {} batch(es), {rate:.0} rows/s; deleting from {}",
        p.outbox_rows,
        p.processed_events,
        p.batches,
        p.table.name()
    )
}

/// `audit`: what the database recorded over the window. The comparison with
/// the effects a downstream counted is `simulator audit`'s: the relay reads
/// nothing but its own tables.
pub async fn audit(database: &db::Database, since: Duration, json: bool) -> anyhow::Result<()> {
    let client = database.connect("outbox-relay-cli").await?;
    let report = storage::audit(&client, since).await?;
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut out, &report)?;
        out.write_all(b"\n")?;
        return Ok(());
    }
    write_audit(&mut out, &report)?;
    Ok(())
}

fn write_audit(out: &mut impl std::io::Write, a: &storage::Audit) -> std::io::Result<()> {
    let share = |part: i64, whole: i64| {
        if whole > 0 {
            format!("{:.1}%", 100.0 * part as f64 / whole as f64)
        } else {
            "-".into()
        }
    };
    let window = terminal::window(a.since_seconds);
    if a.deliveries == 0 && a.commands.is_empty() {
        writeln!(
            out,
            "Audit of the last {window}: no delivery received and no command enqueued"
        )?;
        return Ok(());
    }
    writeln!(out, "Audit of the last {window}")?;
    writeln!(out)?;
    writeln!(out, "  deliveries received     {:>10}", a.deliveries)?;
    writeln!(out, "  distinct event ids      {:>10}", a.distinct_events)?;
    writeln!(
        out,
        "  duplicate deliveries    {:>10}  ({} of deliveries)",
        a.duplicate_deliveries,
        share(a.duplicate_deliveries, a.deliveries)
    )?;
    let statuses: Vec<String> = a
        .events_by_status
        .iter()
        .map(|(s, n)| format!("{} {n}", printable(s)))
        .collect();
    writeln!(out, "  events by status        {}", statuses.join(", "))?;
    writeln!(out)?;
    writeln!(
        out,
        "  {:<20} {:>9} {:>10} {:>8} {:>6} {:>10}",
        "command", "enqueued", "delivered", "pending", "dead", "cancelled"
    )?;
    let mut kinds: Vec<&str> = a.commands.iter().map(|(k, _, _)| k.as_str()).collect();
    kinds.dedup();
    for kind in kinds {
        let count = |status: &str| {
            a.commands
                .iter()
                .filter(|(k, s, _)| k == kind && (status.is_empty() || s == status))
                .map(|(_, _, n)| n)
                .sum::<i64>()
        };
        writeln!(
            out,
            "  {:<20} {:>9} {:>10} {:>8} {:>6} {:>10}",
            printable(kind),
            count(""),
            count("done"),
            count("pending"),
            count("dead"),
            count("cancelled")
        )?;
    }
    writeln!(
        out,
        "  commands enqueued twice for one order: {}",
        a.double_enqueued
    )?;
    Ok(())
}
