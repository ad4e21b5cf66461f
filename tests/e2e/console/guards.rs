//! The console's guards over plain HTTP, each with the database looked at
//! afterwards: no session, a CSRF token not the session's, actions off, a
//! wrong token; the headers every response carries; and an action racing the
//! CLI for one row, applied once.

use reqwest::StatusCode;
use reqwest::redirect::Policy;
use simulator::downstream::ScriptStep;

use super::{Console, TOKEN, pay, until};
use crate::harness::{Stack, StackOptions};

/// An HTTP client that shows redirects rather than following them.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap()
}

/// The page at `path`, with the session `cookie` if any.
async fn get_page(console: &Console, http: &reqwest::Client, cookie: Option<&str>, path: &str) -> String {
    let mut request = http.get(format!("{}{path}", console.url));
    if let Some(cookie) = cookie {
        request = request.header("cookie", cookie);
    }
    request.send().await.unwrap().text().await.unwrap()
}

/// The CSRF token a page's forms carry.
fn csrf_of(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("every signed-in page carries the sign-out form's CSRF token")
        .to_owned()
}

/// Signs in over HTTP: the session cookie (`name=value`) and the CSRF token
/// the pages' forms carry.
async fn signed_in(console: &Console, http: &reqwest::Client) -> (String, String) {
    let response = http
        .post(format!("{}/login", console.url))
        .form(&[("operator", "dee"), ("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let set = response.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let cookie = set.split(';').next().unwrap().to_owned();
    let page = get_page(console, http, Some(&cookie), "/").await;
    let csrf = csrf_of(&page);
    (cookie, csrf)
}

/// A stack with one dead shipment (order 7501), and its row's id.
async fn one_dead_letter() -> (Stack, i64) {
    let stack = Stack::start(StackOptions::default()).await;
    stack.downstream.script("ship-7501", [ScriptStep::Status(422)]);
    stack.insert_order(7501, "pay_7501").await;
    pay(&stack, "evt_7501", "pay_7501").await;
    until(&stack, "SELECT count(*) FROM outbox WHERE status = 'dead'", 1).await;
    let id = stack.count("SELECT id FROM outbox WHERE status = 'dead'").await;
    (stack, id)
}

async fn requeue(
    console: &Console,
    http: &reqwest::Client,
    id: i64,
    cookie: Option<&str>,
    csrf: &str,
) -> StatusCode {
    let mut request = http
        .post(format!("{}/dead/{id}/requeue", console.url))
        .form(&[("csrf", csrf)]);
    if let Some(cookie) = cookie {
        request = request.header("cookie", cookie);
    }
    request.send().await.unwrap().status()
}

#[tokio::test]
async fn without_a_session_or_with_another_csrf_token_nothing_changes() {
    let (stack, id) = one_dead_letter().await;
    let console = Console::start(&stack, true).await;
    let http = client();

    let page = http
        .get(format!("{}/dead/{id}", console.url))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::SEE_OTHER, "a page without a session");
    assert_eq!(page.headers()["location"], format!("/login?next=%2Fdead%2F{id}"));
    assert_eq!(
        requeue(&console, &http, id, None, "anything").await,
        StatusCode::UNAUTHORIZED
    );
    let wrong = http
        .post(format!("{}/login", console.url))
        .form(&[("operator", "dee"), ("token", "not-the-console-token")])
        .send()
        .await
        .unwrap();
    assert_eq!(
        wrong.status(),
        StatusCode::UNAUTHORIZED,
        "a wrong token signs nobody in"
    );
    assert!(wrong.headers().get("set-cookie").is_none());

    let (cookie, csrf) = signed_in(&console, &http).await;
    // The session's token with its last digit changed: as long, one digit off.
    let last = if csrf.ends_with('0') { '1' } else { '0' };
    let forged = format!("{}{last}", &csrf[..csrf.len() - 1]);
    assert_eq!(
        requeue(&console, &http, id, Some(&cookie), &forged).await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        stack
            .count("SELECT count(*) FROM outbox WHERE status = 'dead'")
            .await,
        1,
        "still dead"
    );

    // The same request with the session's token is the one that acts.
    assert_eq!(
        requeue(&console, &http, id, Some(&cookie), &csrf).await,
        StatusCode::OK
    );
    until(
        &stack,
        &format!("SELECT count(*) FROM outbox WHERE id = {id} AND status = 'done'"),
        1,
    )
    .await;
    assert_eq!(
        requeue(&console, &http, id, Some(&cookie), &csrf).await,
        StatusCode::CONFLICT,
        "not dead any more"
    );
    let metrics = testkit::metrics::Metrics::fetch(&http, &console.admin)
        .await
        .unwrap();
    let requeues = |outcome| {
        metrics.find(
            "ops_console_actions_total",
            &[("action", "requeue"), ("outcome", outcome)],
        )
    };
    assert_eq!(
        [requeues("refused"), requeues("done"), requeues("unchanged")],
        [Some(2.0), Some(1.0), Some(1.0)],
        "ops_console_actions_total counts each answer: no session and the forged token refused, one done, one unchanged"
    );
}

#[tokio::test]
async fn with_actions_off_none_is_offered_and_each_is_refused() {
    let (stack, id) = one_dead_letter().await;
    let console = Console::start(&stack, false).await;
    let http = client();
    let (cookie, csrf) = signed_in(&console, &http).await;
    let page = get_page(&console, &http, Some(&cookie), &format!("/dead/{id}")).await;
    assert!(
        page.contains("HTTP 422") && !page.contains("/requeue"),
        "read, and no action offered"
    );
    assert_eq!(
        requeue(&console, &http, id, Some(&cookie), &csrf).await,
        StatusCode::FORBIDDEN
    );
    let discard = http
        .post(format!("{}/dead/{id}/discard", console.url))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str()), ("reason", "no")])
        .send()
        .await
        .unwrap();
    assert_eq!(discard.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        stack
            .count("SELECT count(*) FROM outbox WHERE status = 'dead'")
            .await,
        1,
        "still dead"
    );
    let get = http
        .get(format!("{}/dead/{id}/requeue", console.url))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(
        get.status(),
        StatusCode::METHOD_NOT_ALLOWED,
        "actions are POST only"
    );
}

#[tokio::test]
async fn every_response_forbids_framing_scripts_and_caching() {
    let stack = Stack::start(StackOptions::default()).await;
    let console = Console::start(&stack, false).await;
    let http = client();
    for path in ["/login", "/", "/style.css", "/no-such-page"] {
        let response = http.get(format!("{}{path}", console.url)).send().await.unwrap();
        let h = response.headers();
        let csp = h["content-security-policy"].to_str().unwrap();
        for directive in [
            "default-src 'none'",
            "frame-ancestors 'none'",
            "form-action 'self'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert!(
            !csp.contains("script-src"),
            "{path}: no script source at all: {csp}"
        );
        assert_eq!(h["x-frame-options"], "DENY", "{path}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["cache-control"], "no-store", "{path}");
    }
}

#[tokio::test]
async fn the_console_and_the_cli_racing_for_one_payment_apply_it_once() {
    let stack = Stack::start(StackOptions::default()).await;
    pay(&stack, "evt_race_7601", "pay_7601").await;
    stack
        .client
        .batch_execute("UPDATE processed_events SET processed_at = now() - interval '4 days'")
        .await
        .unwrap();
    stack.insert_order(7601, "pay_7601").await;
    let console = Console::start(&stack, true).await;
    let http = client();
    let (cookie, csrf) = signed_in(&console, &http).await;
    let url = stack._db.url_as(testkit::Role::Ingest);
    let cli = tokio::task::spawn_blocking(move || {
        testkit::bin::run_cli(
            testkit::bin::path("webhook-ingest").to_str().unwrap(),
            &url,
            &["events", "replay", "evt_race_7601"],
        )
    });
    let browser_side = http
        .post(format!("{}/events/evt_race_7601/replay", console.url))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap()
        .status();
    let (cli_ok, cli_out, _) = cli.await.unwrap();
    assert!(
        cli_ok,
        "the CLI's replay exits 0 whether it applied or found it applied: {cli_out}"
    );
    let applied = [browser_side == StatusCode::OK, cli_out.starts_with("replayed")];
    assert_eq!(
        applied.iter().filter(|a| **a).count(),
        1,
        "exactly one applied it: {applied:?} {cli_out}"
    );
    until(
        &stack,
        "SELECT count(*) FROM outbox WHERE order_id = 7601 AND status = 'done'",
        2,
    )
    .await;
    assert_eq!(
        stack
            .count("SELECT count(*) FROM outbox WHERE order_id = 7601")
            .await,
        2
    );
    assert_eq!(stack.downstream.stats().key("ship-7601").effects, 1);
}

/// The console's paths and methods docs/openapi.yaml documents (tag
/// `console`: the paths whose `servers` is the console's), read from its text.
fn documented() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(testkit::workspace_root().join("docs/openapi.yaml")).unwrap();
    let mut found = Vec::new();
    let mut path: Option<String> = None;
    let mut console = false;
    for line in doc.lines() {
        if let Some(p) = line.strip_prefix("  /").and_then(|l| l.strip_suffix(':')) {
            path = Some(format!("/{p}"));
            console = false;
        } else if line.starts_with("    servers:") {
            console = line.contains("console");
        } else if let (Some(p), true) = (&path, console) {
            for method in ["get", "post"] {
                if line == format!("    {method}:") {
                    found.push((p.clone(), method.to_owned()));
                }
            }
        } else if !line.starts_with(' ') {
            path = None;
        }
    }
    found
}

#[tokio::test]
async fn every_documented_page_and_action_is_served() {
    let stack = Stack::start(StackOptions::default()).await;
    let console = Console::start(&stack, true).await;
    let http = client();
    let (cookie, csrf) = signed_in(&console, &http).await;
    let mut documented = documented();
    assert_eq!(
        documented.len(),
        15,
        "the console's operations in docs/openapi.yaml: {documented:?}"
    );
    // Signing out last, so that every other request carries the session.
    documented.sort_by_key(|(path, _)| path == "/logout");
    for (path, method) in &documented {
        let url = format!("{}{}", console.url, path.replace("{id}", "1"));
        let request = match method.as_str() {
            "get" => http.get(&url),
            _ => http
                .post(&url)
                .form(&[("csrf", csrf.as_str()), ("reason", "a check")]),
        };
        let answer = request.header("cookie", &cookie).send().await.unwrap();
        let status = answer.status();
        // Served: a page, a redirect or a refusal of the console's own, never
        // the default answer to a path it does not serve (a 404 page titled
        // "Not found"); the ids are of nothing, so 404 "No such ..." is served.
        let body_is_default = answer.text().await.unwrap().contains("<h1>Not found</h1>");
        assert!(
            !body_is_default && status != StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}: {status}"
        );
    }
}

#[test]
fn the_console_is_off_unless_configured_and_says_which_setting_is_missing() {
    let run = |env: &[(&str, &str)]| {
        let out = std::process::Command::new(testkit::bin::path("ops-console"))
            .env_clear()
            .env("DATABASE_URL", "postgres://console@127.0.0.1:1/db")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8(out.stderr).unwrap())
    };
    for (env, says) in [
        (
            &[][..],
            "CONSOLE_LISTEN_ADDR is required: the console is off unless it names an address",
        ),
        (
            &[("CONSOLE_LISTEN_ADDR", "127.0.0.1:0")][..],
            "CONSOLE_TOKEN is required",
        ),
        (
            &[
                ("CONSOLE_LISTEN_ADDR", "127.0.0.1:0"),
                ("CONSOLE_TOKEN", "tiny-tok"),
            ][..],
            "CONSOLE_TOKEN is too short",
        ),
        (
            &[
                ("CONSOLE_LISTEN_ADDR", "127.0.0.1:0"),
                ("CONSOLE_TOKEN", TOKEN),
                ("CONSOLE_ACTIONS", "yes"),
            ][..],
            "CONSOLE_ACTIONS",
        ),
    ] {
        let (code, stderr) = run(env);
        assert_eq!(code, Some(2), "{env:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(says), "{env:?}: {stderr}");
        assert!(
            !stderr.contains(TOKEN) && !stderr.contains("tiny-tok"),
            "the token is never shown: {stderr}"
        );
    }
}

#[tokio::test]
async fn behind_the_auth_proxy_the_operator_is_whom_its_header_names() {
    let (stack, id) = one_dead_letter().await;
    let console =
        Console::start_with(&stack, true, &[("CONSOLE_OPERATOR_HEADER", "X-Forwarded-Email")]).await;
    let http = client();
    let page = get_page(&console, &http, None, "/login").await;
    assert!(
        !page.contains("Your name"),
        "nothing to type: the proxy names the operator"
    );
    let without = http
        .post(format!("{}/login", console.url))
        .form(&[("operator", "mallory"), ("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(
        without.status(),
        StatusCode::UNAUTHORIZED,
        "a sign-in the proxy did not name"
    );
    assert!(without.headers().get("set-cookie").is_none());

    let signed = http
        .post(format!("{}/login", console.url))
        .header("X-Forwarded-Email", "ann@shop.example")
        .form(&[("operator", "mallory"), ("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(signed.status(), StatusCode::SEE_OTHER);
    let cookie = signed.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let page = get_page(&console, &http, Some(&cookie), &format!("/dead/{id}")).await;
    assert!(page.contains("Sign out ann@shop.example"), "{page}");
    let csrf = csrf_of(&page);
    assert_eq!(
        requeue(&console, &http, id, Some(&cookie), &csrf).await,
        StatusCode::OK
    );
    let audit = console.audit_lines();
    assert_eq!(audit.len(), 1, "{audit:#?}");
    assert_eq!(
        audit[0]["operator"], "ann@shop.example",
        "the proxy's name, not the typed one"
    );
}
