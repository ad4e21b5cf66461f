//! What README.md says of the commands holds: every line of a block marked
//! `<!-- runnable -->` runs on a stack in the walkthrough's state (payment
//! `evt_1K9x` processed for order 998, its shipment dead after the carrier's
//! 422), exits 0 and prints something; with `--json` added where the line
//! changes nothing, prints JSON lines; and the README's exit-code table
//! holds (1 for what is not there, 2 for a wrong command line).

use std::path::Path;
use std::time::Duration;

use simulator::downstream::faults::ScriptStep;
use testkit::Role;

use crate::harness::{Stack, StackOptions, event};

/// The commands of every runnable block of `file`, comments dropped.
fn runnable_lines(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut lines = Vec::new();
    let mut marked = false;
    let mut inside = false;
    for line in text.lines() {
        if line.trim() == "<!-- runnable -->" {
            marked = true;
        } else if line.starts_with("```") {
            inside = marked && !inside;
            marked = false;
        } else if inside && !line.trim().is_empty() {
            let command = line.split(" # ").next().unwrap().trim();
            lines.push(command.to_owned());
        }
    }
    lines
}

/// A command line split as a shell would: words, and "double-quoted" words.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !current.is_empty() {
                    out.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// Runs `args` (program first) with the database URL of its service's role:
/// (exit code, stdout, stderr).
fn run(stack: &Stack, args: &[String]) -> (i32, String, String) {
    let role = if args[0] == "webhook-ingest" {
        Role::Ingest
    } else {
        Role::Relay
    };
    let out = std::process::Command::new(testkit::bin::path(&args[0]))
        .args(&args[1..])
        .env_clear()
        .env("DATABASE_URL", stack._db.url_as(role))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The walkthrough's state: order 998 paid by `evt_1K9x`, its confirmation
/// sent and its shipment dead (the carrier answered 422). The dead row's id.
async fn walkthrough_state(stack: &Stack) -> i64 {
    stack.downstream.script("ship-998", [ScriptStep::Status(422)]);
    stack.insert_order(998, "pay_998").await;
    let answer = stack
        .post(&event("evt_1K9x", "payment.succeeded", "pay_998"), &[])
        .await;
    assert_eq!(answer.status(), 200);
    stack
        .wait_for(
            "SELECT count(*) FROM outbox WHERE order_id = 998 AND status IN ('dead', 'done')",
            2,
            Duration::from_secs(30),
        )
        .await;
    let row = stack
        .client
        .query_one(
            "SELECT id FROM outbox WHERE order_id = 998 AND status = 'dead'",
            &[],
        )
        .await
        .unwrap();
    row.get(0)
}

#[tokio::test]
async fn the_readmes_runnable_commands_run_as_it_says() {
    let stack = Stack::start(StackOptions::default()).await;
    let dead = walkthrough_state(&stack).await.to_string();
    let lines = runnable_lines(&testkit::workspace_root().join("README.md"));
    assert!(lines.len() >= 10, "the runnable block is gone: {lines:?}");
    for line in &lines {
        let args: Vec<String> = words(line)
            .into_iter()
            .map(|w| if w == "597" { dead.clone() } else { w })
            .collect();
        let changes = ["replay", "discard", "prune"]
            .iter()
            .any(|c| args.contains(&(*c).to_owned()))
            || (args.contains(&"requeue".to_owned()) && !args.contains(&"--dry-run".to_owned()));
        if !changes {
            let mut json = args.clone();
            json.push("--json".to_owned());
            let (code, stdout, stderr) = run(&stack, &json);
            assert_eq!(code, 0, "{json:?}: {stderr}");
            for l in stdout.lines() {
                serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{json:?}: {e}: {l}"));
            }
        }
        let (code, stdout, stderr) = run(&stack, &args);
        assert_eq!(code, 0, "{line}: {stderr}");
        assert!(!stdout.trim().is_empty(), "{line} printed nothing");
    }
    // The exit-code table: 1 for what is not there, 2 for a wrong command line.
    let not_there = run(&stack, &words("webhook-ingest events show evt_never_sent"));
    assert_eq!(not_there.0, 1, "{}", not_there.2);
    assert!(
        not_there.2.starts_with("webhook-ingest: error: "),
        "{}",
        not_there.2
    );
    let wrong = run(&stack, &words("outbox-relay dead show --kind ship_order"));
    assert_eq!(wrong.0, 2, "{}", wrong.2);
    assert!(wrong.2.starts_with("outbox-relay: usage error: "), "{}", wrong.2);
}
