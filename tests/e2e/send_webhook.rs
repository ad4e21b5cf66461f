//! `simulator send`, the way to send a webhook by hand (README), signs as
//! the ingest verifies, in both schemes: one processed event, one shipment
//! and one email, a replay on the second send, and a 401 that writes
//! nothing under a wrong secret.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{SECRET, Stack, StackOptions};

/// Runs `simulator send ARGS --target <the ingest>`; its exit code and stdout.
fn send(stack: &Stack, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(testkit::bin::path("simulator"))
        .arg("send")
        .args(args)
        .args(["--target", &stack.ingest_url])
        .env_remove("PROVIDER_SECRET")
        .env_remove("PROVIDER_SCHEME")
        .envs(env.iter().copied())
        .output()
        .expect("simulator runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

async fn wait_for_effects(stack: &Stack, keys: &[&str]) {
    let started = Instant::now();
    loop {
        let stats = stack.downstream.stats();
        let effects: Vec<u64> = keys
            .iter()
            .map(|key| {
                stats
                    .keys
                    .as_ref()
                    .and_then(|k| k.get(*key))
                    .map_or(0, |k| k.effects)
            })
            .collect();
        if effects.iter().all(|&n| n == 1) {
            // Once more after a pause: still one each, nothing else.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let stats = stack.downstream.stats();
            assert_eq!(stats.effects, keys.len() as u64, "effects at the downstream");
            assert_eq!(stats.double_effects, 0);
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "effects for {keys:?}: {effects:?}, expected one each"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn standard_scheme_one_effect_each_then_a_replay_and_a_wrong_secret_writes_nothing() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.insert_order(7, "pay_7").await;

    let (code, out) = send(
        &stack,
        &["pay_7", "--id", "evt_by_hand"],
        &[("PROVIDER_SECRET", SECRET)],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("200 event evt_by_hand\n"), "{out}");
    assert!(out.contains(r#""status": "processed""#), "{out}");
    assert!(!out.contains("Idempotent-Replayed"), "{out}");

    let (code, again) = send(
        &stack,
        &["pay_7", "--id", "evt_by_hand"],
        &[("PROVIDER_SECRET", SECRET)],
    );
    assert_eq!(code, 0, "{again}");
    assert!(
        again.starts_with("200 event evt_by_hand  Idempotent-Replayed: true\n"),
        "{again}"
    );
    assert_eq!(out.lines().nth(1), again.lines().nth(1), "the replay's body");

    wait_for_effects(&stack, &["ship-7", "conf-7"]).await;

    let wrong = "whsec_d3Jvbmctc2VjcmV0LXdyb25nLXNlY3JldA==";
    let (code, out) = send(
        &stack,
        &["pay_7", "--id", "evt_forged"],
        &[("PROVIDER_SECRET", wrong)],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("401 event evt_forged\n"), "{out}");
    assert_eq!(
        stack
            .count("SELECT count(*) FROM processed_events WHERE event_id = 'evt_forged'")
            .await,
        0
    );
    assert_eq!(
        stack
            .count("SELECT sum(deliveries)::bigint FROM processed_events")
            .await,
        2,
        "two deliveries of evt_by_hand, nothing else"
    );
}

#[tokio::test]
async fn stripe_scheme_and_a_refund() {
    let secret = "sk_hand_test_secret";
    let stack = Stack::start(StackOptions {
        ingest_env: vec![
            ("WEBHOOK_SIGNATURE_SCHEME", "stripe".into()),
            ("WEBHOOK_SECRETS", secret.into()),
        ],
        ..Default::default()
    })
    .await;
    stack.insert_order(8, "pay_8").await;
    let env = [("PROVIDER_SECRET", secret), ("PROVIDER_SCHEME", "stripe")];

    let (code, out) = send(&stack, &["pay_8", "--id", "evt_pay_8"], &env);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(r#""status": "processed""#), "{out}");
    wait_for_effects(&stack, &["ship-8", "conf-8"]).await;

    let (code, out) = send(
        &stack,
        &["pay_8", "--id", "evt_refund_8", "--type", "payment.refunded"],
        &env,
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(r#""status": "refunded""#), "{out}");
    wait_for_effects(&stack, &["ship-8", "conf-8", "refund-8"]).await;
}
