//! The operator's console (`ops-console`) against the real services and a
//! real database, driven in a real browser (Debian's Chromium over
//! WebDriver: `browser.rs`), and its guards over plain HTTP: what a person
//! does at 3 a.m. (sign in, read one event's story, requeue and discard dead
//! letters, settle unmatched payments) and what an attacker tries (no
//! session, a forged form, actions off, markup in a payload).

mod browser;
mod grants;
mod guards;
mod plans;
mod settle;
mod story;

use std::time::Duration;

use testkit::Role;

use crate::harness::{Proc, Stack, TempDir};
use browser::Browser;

/// The token the tests' consoles take (CONSOLE_TOKEN).
pub const TOKEN: &str = "console-test-token-7f3a9c2e5b1d";

/// A console process beside a stack, logging in as the console's role.
pub struct Console {
    pub proc: Proc,
    pub url: String,
    /// Its admin listener: /healthz, /readyz, /metrics.
    pub admin: String,
    _dir: TempDir,
}

impl Console {
    /// Starts `ops-console` on `stack`'s database, its actions on or off,
    /// and waits until it is ready.
    pub async fn start(stack: &Stack, actions: bool) -> Self {
        Self::start_with(stack, actions, &[]).await
    }

    /// The same, with more variables.
    pub async fn start_with(stack: &Stack, actions: bool, more: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "e2e-console-{}-{}",
            std::process::id(),
            testkit::free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let (port, admin) = (testkit::free_port(), testkit::free_port());
        let env: Vec<(String, String)> = [
            ("DATABASE_URL", stack._db.url_as(Role::Console)),
            ("CONSOLE_LISTEN_ADDR", format!("127.0.0.1:{port}")),
            ("ADMIN_LISTEN_ADDR", format!("127.0.0.1:{admin}")),
            ("CONSOLE_TOKEN", TOKEN.to_owned()),
            ("CONSOLE_ACTIONS", if actions { "on" } else { "off" }.to_owned()),
            ("CONSOLE_COOKIE", "plain-http".to_owned()),
            (
                "CONSOLE_TRACE_URL",
                "http://traces.example/trace/{trace_id}".to_owned(),
            ),
            ("LOG_FORMAT", "json".to_owned()),
            ("RUST_LOG", "info".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .chain(more.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())))
        .collect();
        let proc = Proc::spawn("ops-console", &env, &dir);
        let admin = format!("http://127.0.0.1:{admin}");
        crate::harness::wait_ready(&stack.http, &admin).await;
        Self {
            proc,
            url: format!("http://127.0.0.1:{port}"),
            admin,
            _dir: TempDir(dir),
        }
    }

    /// The console's log lines that are its actions' audit records.
    pub fn audit_lines(&self) -> Vec<serde_json::Value> {
        self.proc
            .log()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|l| l["message"] == "console action")
            .collect()
    }
}

/// Signs in as `operator` in `browser`, from the page `path` (which sends
/// the browser to the sign-in page and back).
pub async fn sign_in(browser: &Browser, console: &Console, path: &str, operator: &str) {
    browser.goto(&format!("{}{path}", console.url)).await;
    assert!(
        browser.url().await.contains("/login?next="),
        "a page without a session sends the browser to sign in, not {}",
        browser.url().await
    );
    browser.fill("Your name", operator).await;
    browser.fill("Console token", TOKEN).await;
    browser.press("Sign in").await;
    assert!(
        browser.url().await.ends_with(path),
        "signed in, back at {path}, not {}",
        browser.url().await
    );
}

/// Posts a payment for `payment_id` and waits for its answer.
pub async fn pay(stack: &Stack, event_id: &str, payment_id: &str) {
    let response = stack
        .post(&testkit::event(event_id, "payment.succeeded", payment_id), &[])
        .await;
    assert_eq!(
        response.status(),
        200,
        "{event_id}: {}",
        response.text().await.unwrap()
    );
}

/// Waits until `sql` counts `n`.
pub async fn until(stack: &Stack, sql: &str, n: i64) {
    stack.wait_for(sql, n, Duration::from_secs(20)).await;
}
