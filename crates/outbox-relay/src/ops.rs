//! The operator's commands: `dead list`, `dead requeue`, `stats`, `prune`, `audit`.
//! Tables for people, `--json` (one object per line) for scripts. Text from
//! the database goes through [`printable`] in the tables (serde escapes it
//! in the JSON).

use std::io::Write as _;

use process::terminal::printable;

use crate::storage;

pub async fn dead_list(database: &db::Database, json: bool) -> anyhow::Result<()> {
    let client = database.connect("outbox-relay-cli").await?;
    let rows = storage::dead_rows(&client).await?;
    let mut out = std::io::stdout().lock();
    if json {
        for row in &rows {
            serde_json::to_writer(&mut out, row)?;
            out.write_all(b"\n")?;
        }
        return Ok(());
    }
    writeln!(
        out,
        "{:>10} {:<20} {:<24} {:>8} {:>10}  LAST_ERROR",
        "ID", "KIND", "IDEMPOTENCY_KEY", "ATTEMPTS", "AGE"
    )?;
    for r in &rows {
        writeln!(
            out,
            "{:>10} {:<20} {:<24} {:>8} {:>10}  {}",
            r.id,
            printable(&r.kind),
            printable(&r.idempotency_key),
            r.attempts,
            human_age(r.age_seconds),
            printable(r.last_error.as_deref().unwrap_or("-"))
        )?;
    }
    if rows.is_empty() {
        writeln!(out, "(no dead rows)")?;
    }
    Ok(())
}

pub async fn dead_requeue(database: &db::Database, id: Option<i64>) -> anyhow::Result<()> {
    let client = database.connect("outbox-relay-cli").await?;
    let n = storage::requeue_dead(&client, id).await?;
    match (id, n) {
        (Some(id), 0) => anyhow::bail!("row {id} is not dead (or does not exist)"),
        _ => println!("requeued {n} row(s): pending, due now, attempts reset"),
    }
    Ok(())
}

#[derive(serde::Serialize)]
struct Stats {
    by_status_and_kind: Vec<storage::StatusKindCount>,
    pending: i64,
    due: i64,
    dead: i64,
    oldest_pending_age_seconds: f64,
}

pub async fn stats(database: &db::Database, json: bool) -> anyhow::Result<()> {
    let client = database.connect("outbox-relay-cli").await?;
    let by_status_and_kind = storage::counts_by_status_and_kind(&client).await?;
    let backlog = storage::backlog(&client).await?;
    let stats = Stats {
        by_status_and_kind,
        pending: backlog.pending,
        due: backlog.due,
        dead: backlog.dead,
        oldest_pending_age_seconds: backlog.oldest_pending_age_seconds,
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
    writeln!(
        out,
        "oldest pending: {}",
        human_age(stats.oldest_pending_age_seconds)
    )?;
    Ok(())
}

pub async fn prune(database: &db::Database, retention_days: u32) -> anyhow::Result<()> {
    let client = database.connect_with(&storage::prune_connect_options()).await?;
    let pruned = storage::prune(&client, retention_days).await?;
    if !pruned.ran {
        println!("another replica is pruning right now; nothing done");
    } else {
        let wal = match pruned.wal_compression {
            Some(method) => format!("its WAL's full-page images compressed with {method}"),
            None => "the server's wal_compression setting applied (this role may not set it: deploy/sql/roles.sql)"
                .to_owned(),
        };
        println!(
            "pruned {} outbox row(s) and {} processed event(s) older than {retention_days} day(s); {wal}",
            pruned.outbox_rows, pruned.processed_events
        );
    }
    Ok(())
}

fn human_age(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// `audit`: what the database recorded over the window. The comparison with
/// the effects a downstream counted is `simulator audit`'s: the relay reads
/// nothing but its own tables.
pub async fn audit(database: &db::Database, since: std::time::Duration, json: bool) -> anyhow::Result<()> {
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
    writeln!(out, "Audit of the last {}", human_age(a.since_seconds as f64))?;
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

#[cfg(test)]
mod tests {
    #[test]
    fn ages() {
        assert_eq!(super::human_age(5.2), "5s");
        assert_eq!(super::human_age(600.0), "10m");
        assert_eq!(super::human_age(3.0 * 3600.0), "3h");
        assert_eq!(super::human_age(3.0 * 86_400.0), "3d");
        assert_eq!(super::human_age(-1.0), "0s");
    }
}
