//! One event's deliveries: signatures, retries after timeouts and 503s,
//! permanent failures, rotation away from a dead target, giving up.

use std::time::Duration;

use simulator::provider::{self, Scheme, Secret};

use crate::fake::{Behaviour, FakeIngest, dead_target, silent_target};
use crate::helpers::{config, secret_of};

#[tokio::test]
async fn signatures_verify_in_both_schemes_and_the_webhook_id_is_per_event() {
    for scheme in [Scheme::Standard, Scheme::Stripe] {
        let fake = FakeIngest::start(scheme, secret_of(scheme), 100, Behaviour::default()).await;
        let mut config = config(scheme, &[&fake.url], 20);
        config.duplicates.rate = 1.0;
        config.duplicates.delay = "0..20".parse().unwrap();
        let report = provider::run(config, false).await.unwrap();

        let s = &report.summary;
        assert_eq!(
            (s.events, s.acknowledged, s.failed),
            (20, 20, 0),
            "{scheme:?}: {s:?}"
        );
        assert!(s.success(false));
        let deliveries = fake.deliveries();
        assert_eq!(deliveries.len(), 40);
        assert!(
            deliveries.iter().all(|d| d.verified),
            "{scheme:?}: a signature failed"
        );
        assert_eq!(s.status_counts.get("200"), Some(&40));
        assert_eq!(s.outcomes.get("processed"), Some(&20));
        for n in 1..=20 {
            let of = fake.deliveries_of(&format!("evt_t_{n}"));
            assert_eq!(of.len(), 2);
            let expected = match scheme {
                Scheme::Standard => Some(format!("msg_t_{n}")),
                Scheme::Stripe => None,
            };
            assert!(of.iter().all(|d| d.webhook_id == expected), "{of:?}");
        }
    }
}

#[tokio::test]
async fn a_wrong_secret_is_a_permanent_failure_not_retried() {
    let fake = FakeIngest::start(
        Scheme::Standard,
        "whsec_QUJDREVGR0hJSktMTU5PUA==",
        10,
        Behaviour::default(),
    )
    .await;
    let report = provider::run(config(Scheme::Standard, &[&fake.url], 3), false)
        .await
        .unwrap();
    let s = &report.summary;
    assert_eq!((s.acknowledged, s.failed, s.permanent_failures), (0, 3, 3));
    assert_eq!((s.deliveries, s.retries), (3, 0), "a 401 is not retried");
    assert!(!s.success(false) && s.success(true));
    for record in &report.records {
        assert!(!record.acknowledged);
        assert_eq!((record.status.as_deref(), record.http_status), (None, Some(401)));
    }
    assert!(fake.recorded().is_empty());
}

#[tokio::test]
async fn a_slow_first_attempt_times_out_and_the_retry_is_acknowledged_once() {
    let slow = Behaviour {
        slow_first: 1,
        slow_for: Duration::from_millis(1500),
        ..Behaviour::default()
    };
    let fake = FakeIngest::start(Scheme::Standard, secret_of(Scheme::Standard), 10, slow).await;
    let mut config = config(Scheme::Standard, &[&fake.url], 1);
    config.timeout = Duration::from_millis(300);
    let report = provider::run(config, false).await.unwrap();

    let s = &report.summary;
    assert_eq!(
        (s.acknowledged, s.deliveries, s.timeouts, s.retries),
        (1, 2, 1, 1),
        "{s:?}"
    );
    assert_eq!(fake.deliveries_of("evt_t_1").len(), 2);
    assert_eq!(fake.recorded().len(), 1, "processed once");
    let record = &report.records[0];
    assert_eq!(record.deliveries, 2);
    assert_eq!(
        (record.status.as_deref(), record.http_status),
        (Some("processed"), Some(200))
    );
    assert!(
        s.elapsed_secs < 1.4,
        "the provider did not wait for the slow answer: {s:?}"
    );
}

#[tokio::test]
async fn a_503_is_retried_no_sooner_than_its_retry_after() {
    let unavailable = Behaviour {
        unavailable_first: 1,
        retry_after_secs: 1,
        ..Behaviour::default()
    };
    let fake = FakeIngest::start(Scheme::Stripe, secret_of(Scheme::Stripe), 10, unavailable).await;
    let report = provider::run(config(Scheme::Stripe, &[&fake.url], 1), false)
        .await
        .unwrap();

    let s = &report.summary;
    assert_eq!((s.acknowledged, s.deliveries, s.retries), (1, 2, 1));
    assert_eq!(
        (s.status_counts.get("503"), s.status_counts.get("200")),
        (Some(&1), Some(&1))
    );
    let of = fake.deliveries_of("evt_t_1");
    let gap = of[1].at.duration_since(of[0].at);
    // The backoff alone is at most 5 ms here.
    assert!(gap >= Duration::from_millis(950), "retried after {gap:?}");
    assert_eq!(report.records[0].http_status, Some(200));
}

#[tokio::test]
async fn a_dead_target_loses_no_event() {
    let fake = FakeIngest::start(
        Scheme::Standard,
        secret_of(Scheme::Standard),
        10,
        Behaviour::default(),
    )
    .await;
    let dead = dead_target();
    let report = provider::run(config(Scheme::Standard, &[&dead, &fake.url], 10), false)
        .await
        .unwrap();
    let s = &report.summary;
    assert_eq!(s.acknowledged, 10);
    // Even events start at the dead target, and move on to the live one.
    assert_eq!(
        (s.connection_errors, s.retries, s.deliveries),
        (5, 5, 15),
        "{s:?}"
    );
    assert_eq!(fake.recorded().len(), 10);
}

#[tokio::test]
async fn a_target_that_never_acknowledges_is_given_up_on_in_time() {
    let refusing = Behaviour {
        always: Some(500),
        ..Behaviour::default()
    };
    let fake = FakeIngest::start(Scheme::Standard, secret_of(Scheme::Standard), 10, refusing).await;
    let mut config = config(Scheme::Standard, &[&fake.url], 2);
    config.retry.give_up_after = Duration::from_millis(300);
    let report = provider::run(config, false).await.unwrap();
    let s = &report.summary;
    assert_eq!((s.acknowledged, s.failed, s.permanent_failures), (0, 2, 0));
    assert!(!s.success(true), "a 5xx is not a permanent failure");
    assert!(s.retries >= 2, "retried until the limit: {s:?}");
    assert!(s.elapsed_secs < 2.0, "{s:?}");
    assert!(
        report
            .records
            .iter()
            .all(|r| r.http_status == Some(500) && r.status.is_none())
    );

    // With a retry limit, exactly that many retries.
    let mut config = crate::helpers::config(Scheme::Standard, &[&fake.url], 2);
    config.run_id = "limited".into();
    config.retry.max_retries = Some(2);
    let report = provider::run(config, false).await.unwrap();
    assert_eq!((report.summary.deliveries, report.summary.failed), (6, 2));

    // No answer at all: timeouts, then the give-up time ends the delivery.
    let (_listener, silent) = silent_target();
    let mut config = crate::helpers::config(Scheme::Standard, &[&silent], 1);
    config.timeout = Duration::from_millis(100);
    config.retry.give_up_after = Duration::from_millis(350);
    let report = provider::run(config, false).await.unwrap();
    let s = &report.summary;
    assert_eq!((s.failed, s.status_counts.len()), (1, 0));
    assert!(s.timeouts >= 2 && s.timeouts == s.deliveries, "{s:?}");
    assert_eq!(report.records[0].http_status, None);
}

#[tokio::test]
async fn an_invalid_config_is_an_error() {
    let secret = Secret::parse(Scheme::Stripe, "x").unwrap();
    let config = provider::ProviderConfig::new(
        vec!["http://127.0.0.1:1".parse().unwrap()],
        Scheme::Stripe,
        secret,
    );
    let err = provider::run(config, false).await.unwrap_err();
    assert!(err.to_string().contains("--events"), "{err}");
}
