//! The operator's commands: `dead list`, `dead requeue`, `stats`, `prune`.
//! Tables for people, `--json` (one object per line) for scripts.

use std::io::Write as _;

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
            r.kind,
            r.idempotency_key,
            r.attempts,
            human_age(r.age_seconds),
            r.last_error.as_deref().unwrap_or("-")
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
    by_status_and_kind: Vec<StatusKind>,
    pending: i64,
    due: i64,
    dead: i64,
    oldest_pending_age_seconds: f64,
}

#[derive(serde::Serialize)]
struct StatusKind {
    status: String,
    kind: String,
    count: i64,
}

pub async fn stats(database: &db::Database, json: bool) -> anyhow::Result<()> {
    let client = database.connect("outbox-relay-cli").await?;
    let counts = storage::counts_by_status_and_kind(&client).await?;
    let backlog = storage::backlog(&client).await?;
    let stats = Stats {
        by_status_and_kind: counts
            .into_iter()
            .map(|(status, kind, count)| StatusKind { status, kind, count })
            .collect(),
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
        writeln!(out, "{:<10} {:<20} {:>10}", s.status, s.kind, s.count)?;
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
    let client = database.connect("outbox-relay-prune").await?;
    let pruned = storage::prune(&client, retention_days).await?;
    if !pruned.ran {
        println!("another replica is pruning right now; nothing done");
    } else {
        println!(
            "pruned {} outbox row(s) and {} processed event(s) older than {retention_days} day(s)",
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
