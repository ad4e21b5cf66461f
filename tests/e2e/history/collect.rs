//! What the checker reads once everything stopped: the triggers' records,
//! the final rows, the downstream's keys, and the acknowledged events lost.

use super::*;

pub(super) fn merge(into: &mut HashMap<String, KeyRecord>, stats: &simulator::downstream::Stats) {
    for (key, k) in stats.keys.as_ref().expect("stats with keys") {
        let record = into.entry(key.clone()).or_default();
        record.effects += k.effects;
        record.calls.extend(k.calls.iter().cloned());
    }
}

/// What the checker reads from the database once everything stopped.
pub(super) struct Collected {
    pub(super) claims: Vec<Claim>,
    pub(super) writes: Vec<RowWrite>,
    pub(super) orders: HashMap<i64, String>,
    pub(super) rows: HashMap<(String, i64), String>,
}

/// The triggers' records, the orders' final states and the final outbox
/// rows; a claim drawn after `phase1_end` belongs to phase 2.
pub(super) async fn collect_from_database(client: &tokio_postgres::Client, phase1_end: i64) -> Collected {
    let claims = client
        .query(
            "SELECT seq, op, event_id, event_type, order_id, status,
                    (extract(epoch FROM at) * 1000000)::int8 FROM history_events",
            &[],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| Claim {
            seq: r.get(0),
            op: r.get(1),
            event_id: r.get(2),
            event_type: r.get(3),
            order_id: r.get(4),
            status: r.get(5),
            at_us: r.get(6),
            phase: if r.get::<_, i64>(0) <= phase1_end { 1 } else { 2 },
        })
        .collect();
    let writes = client
        .query(
            "SELECT seq, order_id, kind, op, old_status, new_status, old_owner, new_owner, claimed,
                    (extract(epoch FROM at) * 1000000)::int8 FROM history_outbox",
            &[],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| RowWrite {
            seq: r.get(0),
            order_id: r.get(1),
            kind: r.get(2),
            op: r.get(3),
            old_status: r.get(4),
            new_status: r.get(5),
            old_owner: r.get(6),
            new_owner: r.get(7),
            claimed: r.get(8),
            at_us: r.get(9),
        })
        .collect();
    let orders = client
        .query("SELECT id, status FROM orders", &[])
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let rows = client
        .query("SELECT kind, order_id, status FROM outbox", &[])
        .await
        .unwrap()
        .into_iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect();
    Collected {
        claims,
        writes,
        orders,
        rows,
    }
}

/// Every event the provider holds a 200 for (and retention did not prune)
/// is on the primary now: how many distinct events, and those missing.
pub(super) async fn acknowledged_but_lost(
    client: &tokio_postgres::Client,
    deliveries: &[Delivery],
    pruned: &HashSet<String>,
) -> (usize, Vec<String>) {
    let acknowledged: Vec<String> = deliveries
        .iter()
        .filter(|d| d.status == 200 && !pruned.contains(&d.event_id))
        .map(|d| d.event_id.clone())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let found: HashSet<String> = client
        .query(
            "SELECT event_id FROM processed_events WHERE event_id = ANY($1)",
            &[&acknowledged],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    let mut lost: Vec<String> = acknowledged
        .iter()
        .filter(|id| !found.contains(*id))
        .cloned()
        .collect();
    lost.sort();
    (acknowledged.len(), lost)
}
