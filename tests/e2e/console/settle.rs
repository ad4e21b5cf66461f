//! Acting in the browser: a dead letter requeued and delivered, every dead
//! letter of a kind requeued after its dry-run count, one discarded with a
//! reason, an unmatched payment replayed once its order exists and another
//! discarded; each action in the console's log with its operator.

use simulator::downstream::ScriptStep;

use super::browser::Browser;
use super::{Console, pay, sign_in, until};
use crate::harness::{Stack, StackOptions};

/// A stack whose fulfilment API refuses the shipment of each of `orders`
/// once (HTTP 422, which the relay does not retry): each dies, then is
/// delivered when requeued.
async fn with_dead_shipments(orders: &[i64]) -> Stack {
    let stack = Stack::start(StackOptions::default()).await;
    for order in orders {
        stack
            .downstream
            .script(&format!("ship-{order}"), [ScriptStep::Status(422)]);
        stack.insert_order(*order, &format!("pay_{order}")).await;
        pay(&stack, &format!("evt_{order}"), &format!("pay_{order}")).await;
    }
    let all = orders.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    until(
        &stack,
        &format!("SELECT count(*) FROM outbox WHERE status = 'dead' AND order_id IN ({all})"),
        orders.len() as i64,
    )
    .await;
    stack
}

async fn dead_id(stack: &Stack, order: i64) -> i64 {
    stack
        .count(&format!(
            "SELECT id FROM outbox WHERE kind = 'ship_order' AND order_id = {order}"
        ))
        .await
}

#[tokio::test]
async fn dead_letters_requeued_in_the_browser_are_delivered_once() {
    let stack = with_dead_shipments(&[7201, 7202]).await;
    let console = Console::start(&stack, true).await;
    let browser = Browser::start().await;
    sign_in(&browser, &console, "/dead", "ann").await;
    let text = browser.text().await;
    assert!(
        text.contains("2 dead letter(s)") && text.contains("HTTP 422"),
        "{text}"
    );

    // One, from its own page.
    let first = dead_id(&stack, 7201).await;
    browser.goto(&format!("{}/dead/{first}", console.url)).await;
    browser.press("Requeue it").await;
    assert!(
        browser
            .text()
            .await
            .contains(&format!("Requeued command {first}")),
        "{}",
        browser.text().await
    );
    until(
        &stack,
        &format!("SELECT count(*) FROM outbox WHERE id = {first} AND status = 'done'"),
        1,
    )
    .await;

    // Every one left of the kind: a dry run counts them first.
    browser
        .goto(&format!("{}/dead?kind=ship_order", console.url))
        .await;
    browser
        .press("Requeue every dead letter of kind ship_order")
        .await;
    let text = browser.text().await;
    assert!(
        text.contains("Dry run: 1 dead letter(s) of kind ship_order would be requeued"),
        "{text}"
    );
    assert_eq!(
        stack
            .count("SELECT count(*) FROM outbox WHERE status = 'dead'")
            .await,
        1,
        "a dry run changes nothing"
    );
    browser.press("Requeue these 1").await;
    assert!(
        browser
            .text()
            .await
            .contains("Requeued 1 dead letter(s) of kind ship_order")
    );
    until(
        &stack,
        "SELECT count(*) FROM outbox WHERE kind = 'ship_order' AND status = 'done'",
        2,
    )
    .await;

    let totals = stack.downstream.stats();
    for order in [7201, 7202] {
        assert_eq!(
            totals.key(&format!("ship-{order}")).effects,
            1,
            "order {order} shipped once"
        );
    }
    let audit = console.audit_lines();
    let actions: Vec<(&str, &str, &str)> = audit
        .iter()
        .map(|l| {
            (
                l["operator"].as_str().unwrap(),
                l["action"].as_str().unwrap(),
                l["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("ann", "requeue", "requeued"),
            ("ann", "requeue-all", "requeued 1 (the dry run counted 1)")
        ],
        "{audit:#?}"
    );
}

#[tokio::test]
async fn a_dead_letter_discarded_in_the_browser_keeps_its_reason() {
    let stack = with_dead_shipments(&[7301]).await;
    let console = Console::start(&stack, true).await;
    let browser = Browser::start().await;
    let id = dead_id(&stack, 7301).await;
    sign_in(&browser, &console, &format!("/dead/{id}"), "bo").await;
    browser
        .fill("Why discard it", "shipped by hand from the store")
        .await;
    browser.press("Discard it").await;
    assert!(
        browser.text().await.contains(&format!("Discarded command {id}")),
        "{}",
        browser.text().await
    );
    let kept = stack
        .count(&format!(
            "SELECT count(*) FROM outbox WHERE id = {id} AND status = 'cancelled' \
             AND last_error LIKE 'discarded by an operator: shipped by hand from the store (it died of: HTTP 422%'"
        ))
        .await;
    assert_eq!(kept, 1, "cancelled, with the reason and the error it died of");
    let audit = console.audit_lines();
    assert_eq!(audit.len(), 1, "{audit:#?}");
    assert_eq!(audit[0]["operator"], "bo");
    assert_eq!(audit[0]["action"], "discard");
    assert_eq!(audit[0]["target_id"], id.to_string());
    assert_eq!(audit[0]["reason"], "shipped by hand from the store");
}

#[tokio::test]
async fn an_unmatched_payment_is_replayed_once_its_order_exists_and_another_discarded() {
    let stack = Stack::start(StackOptions::default()).await;
    pay(&stack, "evt_early_7401", "pay_7401").await;
    pay(&stack, "evt_stray_7402", "pay_nobody").await;
    // Both past the provider's retry horizon: the ingest's reconciler no
    // longer applies them by itself; they wait for an operator.
    stack
        .client
        .batch_execute(
            "UPDATE processed_events SET processed_at = now() - interval '4 days' WHERE status = 'unmatched'",
        )
        .await
        .unwrap();
    let console = Console::start(&stack, true).await;
    let browser = Browser::start().await;
    sign_in(&browser, &console, "/unmatched", "cy").await;
    let text = browser.text().await;
    assert!(
        text.contains("evt_early_7401") && text.contains("none yet") && text.contains("4d"),
        "{text}"
    );

    stack.insert_order(7401, "pay_7401").await;
    browser.goto(&format!("{}/unmatched", console.url)).await;
    browser.press("Replay on order 7401").await;
    assert!(
        browser
            .text()
            .await
            .contains("Replayed on order 7401: processed, 2 command(s) enqueued"),
        "{}",
        browser.text().await
    );
    until(
        &stack,
        "SELECT count(*) FROM outbox WHERE order_id = 7401 AND status = 'done'",
        2,
    )
    .await;

    browser.goto(&format!("{}/unmatched", console.url)).await;
    browser
        .fill(
            "Why discard evt_stray_7402",
            "a test payment from the provider's dashboard",
        )
        .await;
    browser.press("Discard").await;
    assert!(
        browser.text().await.contains("Discarded: it is kept"),
        "{}",
        browser.text().await
    );
    assert_eq!(
        stack
            .count("SELECT count(*) FROM processed_events WHERE event_id = 'evt_stray_7402' AND status = 'discarded'")
            .await,
        1
    );
    assert_eq!(
        stack
            .count("SELECT count(*) FROM orders WHERE id = 7401 AND status = 'paid'")
            .await,
        1
    );
    assert_eq!(stack.downstream.stats().key("ship-7401").effects, 1);
}
