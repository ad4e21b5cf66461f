//! What the run is checked against at the end: the provider's summary,
//! the drain, the acknowledgements against the database, the effects against
//! the outbox.

use super::*;

/// The provider's summary: it got a 2xx for every event.
pub(super) fn provider_summary(
    provider: &Proc,
    events: u64,
    tally: &mut Tally,
    progress: &Progress,
) -> serde_json::Value {
    let summary: serde_json::Value = serde_json::from_str(provider.log().lines().last().unwrap_or("{}"))
        .unwrap_or_else(|e| panic!("provider summary: {e}: {}", provider.log()));
    tally.deliveries = summary["deliveries"].as_u64().unwrap();
    tally.duplicates =
        summary["duplicate_deliveries"].as_u64().unwrap() + summary["burst_deliveries"].as_u64().unwrap();
    assert_eq!(
        summary["acknowledged"], summary["events"],
        "the provider got a 2xx for every event: {summary}"
    );
    assert_eq!(summary["events"].as_u64(), Some(events));
    progress.note(&format!(
        "the provider is done: {} events, {} deliveries, every event acknowledged; draining the outbox",
        thousands(events),
        thousands(tally.deliveries)
    ));
    summary
}

/// Waits until no outbox row is pending (the leases of the last killed
/// relay expire in 5 s).
pub(super) async fn drain(client: &tokio_postgres::Client, stack: &Stack, progress: &mut Progress) {
    let drained = Instant::now();
    loop {
        // A cancelled shipment may keep the lease of a relay killed while
        // its call was under way: that outcome never comes.
        let left = testkit::count(client, "SELECT count(*) FROM outbox WHERE status = 'pending'").await;
        if left == 0 {
            break;
        }
        assert!(
            drained.elapsed() < Duration::from_secs(90),
            "{left} rows still pending or leased"
        );
        if progress.due() {
            let totals = stack.downstream.totals();
            progress.line(
                "draining",
                &format!(
                    "{} outbox rows pending | effects {} (requests {})",
                    thousands(left as u64),
                    thousands(totals.effects),
                    thousands(totals.requests)
                ),
                totals.effects,
                "effects",
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    progress.note("drained; checking every acknowledgement and effect");
}

/// What the provider was told, per event, against the database: every
/// acknowledgement recorded with its status. Returns the acknowledged
/// events and every recorded event's status.
pub(super) async fn check_acknowledgements(
    client: &tokio_postgres::Client,
    ack_file: &std::path::Path,
    events: u64,
) -> (HashSet<String>, HashMap<String, String>) {
    let acks: Vec<serde_json::Value> = std::fs::read_to_string(ack_file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(acks.len() as u64, events);
    let acknowledged: HashSet<String> = acks
        .iter()
        .filter(|a| a["acknowledged"] == true)
        .map(|a| a["event_id"].as_str().unwrap().to_owned())
        .collect();
    let recorded: HashMap<String, String> = client
        .query("SELECT event_id, status FROM processed_events", &[])
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for ack in &acks {
        let id = ack["event_id"].as_str().unwrap();
        assert_eq!(
            recorded.get(id).map(String::as_str),
            ack["status"].as_str(),
            "{id}: acknowledged with {} but recorded as {:?}",
            ack["status"],
            recorded.get(id)
        );
    }
    (acknowledged, recorded)
}

/// Outbox rows: all finished, each enqueued by an acknowledged event; their
/// effects at the downstream, exactly: one per done row, at most one per
/// cancelled row, none without a row, none doubled.
pub(super) async fn check_effects(
    client: &tokio_postgres::Client,
    stack: &Stack,
    acknowledged: &HashSet<String>,
    tally: &mut Tally,
) {
    let rows: Vec<(String, String, String)> = client
        .query("SELECT idempotency_key, status, event_id FROM outbox", &[])
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let stats = stack.downstream.stats();
    let keys = stats.keys.as_ref().unwrap();
    for (key, status, event_id) in &rows {
        assert!(
            acknowledged.contains(event_id),
            "{key} enqueued by {event_id}, never acknowledged"
        );
        let effects = keys.get(key).map_or(0, |k| k.effects);
        match status.as_str() {
            "done" => assert_eq!(effects, 1, "{key}: done, so exactly one effect"),
            // Cancelled by a refund: no effect, unless its call was under
            // way at the refund and the downstream did the work but the
            // relay never heard (a timeout, a reset, a kill).
            "cancelled" => assert!(effects <= 1, "{key}: cancelled, {effects} effects"),
            other => panic!("{key} is {other}"),
        }
    }
    let enqueued: HashSet<&str> = rows.iter().map(|(k, _, _)| k.as_str()).collect();
    for (key, k) in keys {
        assert!(
            k.effects == 0 || enqueued.contains(key.as_str()),
            "{key} has an effect but no outbox row"
        );
        assert!(k.effects <= 1, "{key}: {} effects", k.effects);
    }
    tally.requests = stats.requests;
    tally.effects = stats.effects;
    tally.double_effects = stats.double_effects;
    assert_eq!(stats.double_effects, 0);
    let with_effect = |status: &str| {
        rows.iter()
            .filter(|(k, s, _)| s == status && keys.get(k).is_some_and(|k| k.effects == 1))
            .count()
    };
    assert_eq!(
        stats.effects as usize,
        with_effect("done") + with_effect("cancelled")
    );
    assert_eq!(
        with_effect("done"),
        rows.iter().filter(|(_, s, _)| s == "done").count()
    );
    assert!(stats.requests > stats.effects, "the faults made the relays retry");
}
