//! Reading: one event's story found by its id from the search box, by
//! keyboard alone; each page audited by axe-core; a payload carrying
//! markup shown as text.

use fantoccini::key::Key;

use super::browser::Browser;
use super::{Console, pay, sign_in, until};
use crate::harness::{Stack, StackOptions};

#[tokio::test]
async fn an_operator_finds_an_event_by_keyboard_and_reads_its_story_and_commands() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.insert_order(7101, "pay_7101").await;
    pay(&stack, "evt_story_7101", "pay_7101").await;
    // The relay delivers both commands; the story shows them done.
    until(
        &stack,
        "SELECT count(*) FROM outbox WHERE order_id = 7101 AND status = 'done'",
        2,
    )
    .await;
    let console = Console::start(&stack, false).await;
    let browser = Browser::start().await;
    sign_in(&browser, &console, "/", "ann").await;

    // Tab from the top of the page: the skip link, the navigation's three
    // links, sign out, then the search field; type the id and press Enter.
    let mut focused = Vec::new();
    for _ in 0..6 {
        browser.key(Key::Tab).await;
        focused.push(browser.focused().await);
    }
    assert_eq!(
        focused,
        [
            "Skip to the content",
            "Backlog",
            "Dead letters",
            "Unmatched payments",
            "Sign out ann",
            "q"
        ],
        "Tab walks the page in order, to the search field"
    );
    let search = browser.client.active_element().await.unwrap();
    search.send_keys("evt_story_7101").await.unwrap();
    browser.key(Key::Enter).await;

    let text = browser.text().await;
    assert!(
        browser.url().await.ends_with("/events/evt_story_7101"),
        "{}",
        browser.url().await
    );
    for expected in [
        "Event evt_story_7101",
        "payment.succeeded",
        "Commands of order 7101",
        "ship_order",
        "send_confirmation",
        "done",
        "Answer stored for every delivery",
    ] {
        assert!(text.contains(expected), "the story shows `{expected}`:\n{text}");
    }
    let trace_link = browser
        .eval("return [...document.querySelectorAll('a')].map(a => a.href).find(h => h.startsWith('http://traces.example/trace/')) || ''")
        .await;
    assert!(
        !trace_link.as_str().unwrap().is_empty(),
        "the trace id links to CONSOLE_TRACE_URL"
    );
    browser
        .screenshot(&testkit::workspace_root().join("target/console/event-story.png"))
        .await;

    for page in [
        "/events/evt_story_7101",
        "/",
        "/dead",
        "/unmatched",
        "/orders/7101",
    ] {
        browser.goto(&format!("{}{page}", console.url)).await;
        let problems = browser.accessibility_violations().await;
        assert!(problems.is_empty(), "{page}: {problems:#?}");
    }
}

#[tokio::test]
async fn a_payload_carrying_markup_renders_as_text_and_runs_nothing() {
    let stack = Stack::start(StackOptions::default()).await;
    // No order has this payment id: the event is kept `unmatched`, its
    // payment id shown on the unmatched page and in its story.
    let hostile = "<script>window.pwned=1</script><img src=x onerror=window.pwned=2>";
    let body = testkit::event("evt_markup_1", "payment.succeeded", hostile);
    let response = stack.post(&body, &[]).await;
    assert_eq!(response.status(), 200);
    let console = Console::start(&stack, true).await;
    let browser = Browser::start().await;
    sign_in(&browser, &console, "/unmatched", "ann").await;
    for page in ["/unmatched", "/events/evt_markup_1", "/search?q=%3Cscript%3E"] {
        browser.goto(&format!("{}{page}", console.url)).await;
        let text = browser.all_text().await;
        if page != "/search?q=%3Cscript%3E" {
            assert!(
                text.contains(hostile),
                "{page} shows the payment id as text:\n{text}"
            );
        }
        assert_eq!(
            browser
                .eval("return document.querySelectorAll('script, img').length")
                .await,
            0,
            "{page}"
        );
        assert_eq!(
            browser.eval("return typeof window.pwned").await,
            "undefined",
            "{page}"
        );
    }
}
