//! Several events: duplicates on time and late, bursts, closed and open
//! loop, and the ack records against what the ingest recorded.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use simulator::provider::{self, AckRecord, Load, Scheme};

use crate::fake::{Behaviour, FakeIngest};
use crate::helpers::{config, secret_of};

async fn fake(orders: u64, behaviour: Behaviour) -> FakeIngest {
    FakeIngest::start(Scheme::Standard, secret_of(Scheme::Standard), orders, behaviour).await
}

#[tokio::test]
async fn a_duplicate_rate_of_one_delivers_every_event_twice() {
    let fake = fake(100, Behaviour::default()).await;
    let mut config = config(Scheme::Standard, &[&fake.url], 10);
    config.duplicates.rate = 1.0;
    config.duplicates.delay = "0..30".parse().unwrap();
    let report = provider::run(config, false).await.unwrap();

    let s = &report.summary;
    assert_eq!(
        (s.acknowledged, s.deliveries, s.duplicate_deliveries),
        (10, 20, 10),
        "{s:?}"
    );
    assert_eq!(s.replayed, 10, "the second delivery of each is a replay");
    assert_eq!(fake.deliveries().len(), 20);
    assert_eq!(fake.recorded().len(), 10);
    assert!(report.records.iter().all(|r| r.deliveries == 2 && r.acknowledged));
}

#[tokio::test]
async fn late_duplicates_come_after_the_main_phase() {
    let fake = fake(100, Behaviour::default()).await;
    let mut config = config(Scheme::Standard, &[&fake.url], 6);
    config.load = Load::Closed { concurrency: 2 };
    config.duplicates.rate = 1.0;
    config.duplicates.late_rate = 1.0;
    config.duplicates.late_delay = Duration::from_millis(200);
    let report = provider::run(config, false).await.unwrap();

    let s = &report.summary;
    assert_eq!(
        (s.acknowledged, s.duplicate_deliveries, s.replayed),
        (6, 6, 6),
        "{s:?}"
    );
    let deliveries = fake.deliveries();
    let (firsts, lates) = deliveries.split_at(6);
    let mut seen = HashSet::new();
    assert!(
        firsts.iter().all(|d| seen.insert(d.event_id.clone())),
        "each event once, then the late ones"
    );
    assert!(lates.iter().all(|d| d.replayed));
    let last_first = firsts.iter().map(|d| d.at).max().unwrap();
    let first_late = lates.iter().map(|d| d.at).min().unwrap();
    assert!(first_late.duration_since(last_first) >= Duration::from_millis(190));
    // An event is settled (its record written) only after its late delivery.
    assert!(report.records.iter().all(|r| r.deliveries == 2));
}

#[tokio::test]
async fn a_burst_is_burst_size_concurrent_deliveries() {
    // Each delivery is held until all five of its event are in: only a
    // concurrent burst gets through without waiting out the fake's 5 s.
    let gathering = Behaviour {
        gather: Some(5),
        ..Behaviour::default()
    };
    let fake = fake(100, gathering).await;
    let mut config = config(Scheme::Standard, &[&fake.url], 3);
    config.bursts.rate = 1.0;
    config.bursts.size = 5;
    let report = provider::run(config, false).await.unwrap();

    let s = &report.summary;
    assert_eq!(
        (s.acknowledged, s.deliveries, s.burst_deliveries),
        (3, 15, 12),
        "{s:?}"
    );
    assert_eq!((s.replayed, s.retries), (12, 0));
    for n in 1..=3 {
        let of = fake.deliveries_of(&format!("evt_t_{n}"));
        assert_eq!(of.len(), 5);
        assert_eq!(of.iter().map(|d| d.in_flight).max(), Some(5), "{of:?}");
        assert_eq!(
            of.iter().filter(|d| !d.replayed).count(),
            1,
            "exactly one processes"
        );
    }
    assert!(
        s.elapsed_secs < 4.0,
        "no burst waited for the fake's limit: {s:?}"
    );
    assert!(report.records.iter().all(|r| r.deliveries == 5));
}

#[tokio::test]
async fn a_closed_loop_keeps_exactly_its_senders_busy() {
    let slow = Behaviour {
        slow_first: usize::MAX,
        slow_for: Duration::from_millis(20),
        ..Behaviour::default()
    };
    let fake = fake(100, slow).await;
    let mut config = config(Scheme::Standard, &[&fake.url], 40);
    config.load = Load::Closed { concurrency: 4 };
    let report = provider::run(config, false).await.unwrap();
    assert_eq!(report.summary.acknowledged, 40);
    assert_eq!(fake.max_in_flight(), 4);
}

#[tokio::test]
async fn an_open_loop_keeps_its_rate_whatever_the_answers() {
    // Every answer takes 200 ms; at 50 events a second a closed loop of
    // one would manage 5 in that second, the open loop sends all 50.
    let slow = Behaviour {
        slow_first: usize::MAX,
        slow_for: Duration::from_millis(200),
        ..Behaviour::default()
    };
    let fake = fake(100, slow).await;
    let mut config = config(Scheme::Standard, &[&fake.url], 1000);
    config.load = Load::Open { rate: 50.0 };
    config.duration = Some(Duration::from_secs(1));
    let report = provider::run(config, false).await.unwrap();

    let s = &report.summary;
    assert_eq!(s.events, 50, "one event per 20 ms of the second: {s:?}");
    assert_eq!(s.acknowledged, 50);
    assert!(
        fake.max_in_flight() >= 5,
        "requests overlapped: {}",
        fake.max_in_flight()
    );
    assert!(s.latency_ms.p50 >= 195.0, "{:?}", s.latency_ms);
    assert!(s.elapsed_secs >= 1.1, "{s:?}");
}

#[tokio::test]
async fn the_ack_file_says_what_the_ingest_recorded() {
    let fake = fake(40, Behaviour::default()).await;
    let path = std::env::temp_dir().join(format!("provider-acks-{}.jsonl", std::process::id()));
    let mut config = config(Scheme::Standard, &[&fake.url], 80);
    config.load = Load::Closed { concurrency: 4 };
    config.mix.orders = 40;
    config.mix.refund_rate = 0.2;
    config.mix.unknown_rate = 0.1;
    config.mix.unmatched_rate = 0.1;
    config.duplicates.rate = 0.3;
    config.duplicates.delay = "0..20".parse().unwrap();
    config.bursts.rate = 0.1;
    config.bursts.size = 3;
    config.ack_file = Some(path.clone());
    let report = provider::run(config, false).await.unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();

    let lines: Vec<AckRecord> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 80);
    let by_id = |records: &[AckRecord]| {
        let mut sorted = records.to_vec();
        sorted.sort_by(|a, b| a.event_id.cmp(&b.event_id));
        sorted
    };
    assert_eq!(
        by_id(&lines),
        by_id(&report.records),
        "the file and the library agree"
    );
    let ids: HashSet<_> = lines.iter().map(|r| r.event_id.as_str()).collect();
    assert_eq!(ids.len(), 80);

    let recorded = fake.recorded();
    assert_eq!(recorded.len(), 80, "every event acknowledged was recorded, once");
    let mut outcomes: HashMap<String, u64> = HashMap::new();
    let mut paid = HashSet::new();
    for r in &lines {
        assert!(r.acknowledged && r.http_status == Some(200), "{r:?}");
        let status = r.status.as_deref().unwrap();
        assert_eq!(recorded[&r.event_id], status, "{r:?}");
        *outcomes.entry(status.to_owned()).or_default() += 1;
        let expected: &[&str] = match r.event_type.as_str() {
            "customer.updated" => &["ignored"],
            "payment.refunded" => &["refunded"],
            "payment.succeeded" if r.payment_id.starts_with("pay_x") => &["unmatched"],
            "payment.succeeded" => &["processed", "already_paid", "order_refunded"],
            other => panic!("unexpected type {other}"),
        };
        assert!(expected.contains(&status), "{r:?}");
        if status == "processed" {
            paid.insert(r.payment_id.clone());
        }
    }
    for refund in lines.iter().filter(|r| r.event_type == "payment.refunded") {
        assert!(
            paid.contains(&refund.payment_id),
            "refund of an unpaid order: {refund:?}"
        );
    }
    assert!(
        outcomes.len() >= 4,
        "the mix reaches the ingest's paths: {outcomes:?}"
    );
    let s = &report.summary;
    assert_eq!(
        s.outcomes
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect::<HashMap<_, _>>(),
        outcomes
    );
    let attempts: u64 = lines.iter().map(|r| u64::from(r.deliveries)).sum();
    assert_eq!(attempts, s.deliveries);
    assert_eq!(s.deliveries, fake.deliveries().len() as u64);
    assert_eq!(s.retries, 0);
    assert_eq!(s.deliveries, 80 + s.duplicate_deliveries + s.burst_deliveries);
    assert!(s.duplicate_deliveries > 0 && s.burst_deliveries > 0, "{s:?}");
}
