//! `make run` in a short mode: the incident replayed, then its audit checked;
//! kept serving (`RUN_KEEP=1`), then stopped as a user stops it, with Ctrl-C.

use std::io::{BufRead as _, BufReader, Read as _};
use std::os::unix::process::CommandExt as _;
use std::process::{Command, ExitStatus, Stdio};

use testkit::TestDb;

#[tokio::test]
async fn make_run_replays_the_incident_with_no_double_effect() {
    let db = TestDb::new().await;
    let dir = std::env::temp_dir().join(format!("run-demo-{}", testkit::free_port()));
    let bin_dir = testkit::bin::path("webhook-ingest").parent().unwrap().to_owned();
    let ingest = format!("127.0.0.1:{}", testkit::free_port());
    let mut run = Command::new(testkit::workspace_root().join("scripts/run.sh"));
    run.env("DATABASE_URL", &db.url)
        .env("BIN_DIR", &bin_dir)
        .env("RUN_DIR", &dir)
        .env("RUN_EVENTS", "300")
        .env("RUN_RATE", "100")
        .env("RUN_DEGRADED_SECS", "2")
        .env("RUN_STALL_SECS", "1")
        .env("RUN_KEEP", "1")
        .env("INGEST_LISTEN_ADDR", &ingest)
        .env("ADMIN_LISTEN_ADDR", format!("127.0.0.1:{}", testkit::free_port()))
        .env(
            "RELAY_ADMIN_LISTEN_ADDR",
            format!("127.0.0.1:{}", testkit::free_port()),
        );
    let (status, stdout, stderr) = kept_then_interrupted(run, &dir);
    // Ctrl-C ends a kept run with the audit's result (0 here), not 130, and
    // stops everything it started.
    assert!(status.success(), "run.sh failed:\n{stdout}\n{stderr}");
    assert!(stderr.contains("export DATABASE_URL="), "{stderr}");
    assert!(stderr.contains("stopping everything"), "{stderr}");
    assert!(
        std::net::TcpStream::connect(&ingest).is_err(),
        "the ingest still listens on {ingest} after Ctrl-C"
    );
    assert!(stdout.contains("RESULT: exactly once"), "{stdout}");
    assert!(stdout.contains("double effects                 0"), "{stdout}");
    // Plain words and plain text: no Python spelling, no terminal codes in
    // a pipe, and the provider's deliveries reconciled with the database's.
    assert!(stdout.contains("every one acknowledged"), "{stdout}");
    assert!(
        !stdout.contains("True") && !stderr.contains('\x1b'),
        "{stdout}\n{stderr:?}"
    );
    for line in [
        "sent by the provider",
        "timed out at the provider",
        "received by the database",
    ] {
        assert!(stdout.contains(line), "no `{line}` in:\n{stdout}");
    }

    let audit: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("audit.json")).unwrap()).unwrap();
    let provider: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("provider.json")).unwrap()).unwrap();
    assert_eq!(audit["downstream"]["double_effects"], 0);
    assert_eq!(
        provider["acknowledged"], provider["events"],
        "the provider got a 2xx for every event"
    );
    assert_eq!(audit["distinct_events"], provider["events"]);
    // Duplicates are counted: every delivery that reached the ingest, however it ended for the provider.
    let deliveries = audit["deliveries"].as_i64().unwrap();
    let distinct = audit["distinct_events"].as_i64().unwrap();
    assert_eq!(
        audit["duplicate_deliveries"].as_i64().unwrap(),
        deliveries - distinct
    );
    assert!(
        audit["duplicate_deliveries"].as_i64().unwrap() >= provider["duplicate_deliveries"].as_i64().unwrap()
    );
    // Every accepted event's commands were delivered, once.
    let mut done = std::collections::HashMap::new();
    for row in audit["commands"].as_array().unwrap() {
        let (kind, status, n) = (
            row[0].as_str().unwrap(),
            row[1].as_str().unwrap(),
            row[2].as_i64().unwrap(),
        );
        assert!(
            status == "done" || status == "cancelled",
            "{kind} {status} {n}: nothing pending or dead"
        );
        if status == "done" {
            done.insert(kind.to_owned(), n);
        }
    }
    let processed = audit["events_by_status"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[0] == "processed")
        .map(|r| r[1].as_i64().unwrap())
        .unwrap();
    assert_eq!(done["ship_order"] + cancelled(&audit, "ship_order"), processed);
    // A shipment whose call was under way when its order's refund committed
    // may exist with its row cancelled (the one exception of the per-order
    // rules, docs/CONTRACT.md section 7): the downstream's shipments lie
    // between the rows done and those plus the cancelled ones, and the audit
    // counts the difference as allowed.
    let shipments = audit["downstream"]["shipments"].as_i64().unwrap();
    let under_way = audit["exactly_once"]["shipments_under_way"].as_i64().unwrap();
    let (shipped, ship_cancelled) = (done["ship_order"], cancelled(&audit, "ship_order"));
    assert!(
        (shipped..=shipped + ship_cancelled).contains(&shipments),
        "shipments {shipments}, rows done {shipped}, cancelled {ship_cancelled}"
    );
    assert_eq!(shipments - shipped, under_way);
    let _ = std::fs::remove_dir_all(&dir);
}

/// How long `make run`'s short mode may take to print its hints: it takes
/// well under a minute; a run stuck past this is stopped and its logs shown,
/// rather than left to the test runner's timeout, which shows nothing.
const HINTS_WITHIN: std::time::Duration = std::time::Duration::from_secs(180);

/// Runs `run` (RUN_KEEP=1) until it has printed its hints, then sends it
/// SIGINT, as Ctrl-C does: its exit status, stdout and stderr. A run that has
/// not printed them within [`HINTS_WITHIN`] is interrupted and the test fails
/// with what it printed and the tails of its services' logs (in `dir`).
fn kept_then_interrupted(mut run: Command, dir: &std::path::Path) -> (ExitStatus, String, String) {
    // A group of its own: the services it started hold its stdout and
    // stderr too, so a run killed below is killed with them, or reading its
    // output would wait for them for ever.
    let mut child = run
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut text = String::new();
        out.read_to_string(&mut text).unwrap();
        text
    });
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let (lines, hints) = std::sync::mpsc::channel();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        // The hints' last line, not "still serving" above them: a Ctrl-C
        // between the two ends the run before the hints (seen in CI: no
        // `export DATABASE_URL=` in stderr).
        while !text.contains("# the relay's") {
            if err.read_line(&mut text).unwrap() == 0 {
                break; // it ended without keeping the stack: the caller's asserts say why
            }
        }
        let _ = lines.send(());
        err.read_to_string(&mut text).unwrap();
        text
    });
    let in_time = hints.recv_timeout(HINTS_WITHIN).is_ok();
    // A child that has ended but is not yet waited for still takes a signal.
    let interrupted = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    // Bash runs its trap once the command in the foreground returns: a
    // minute at most here; then it is killed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // `--` before the group: without it procps-ng's kill takes `-12345` for
    // `-1` (its first digit), and SIGKILLs every process root may signal.
    let _ = Command::new("kill")
        .args(["-s", "KILL", "--", &format!("-{}", child.id())])
        .status();
    let status = child.wait().unwrap();
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    assert!(
        in_time,
        "make run printed no hints within {HINTS_WITHIN:?}; stopped.\nstdout:\n{stdout}\nstderr:\n{stderr}\n{}",
        ["ingest.log", "relay.log", "downstream.log"]
            .iter()
            .map(|log| format!("{log} (last lines):\n{}", tail(&dir.join(log), 20)))
            .collect::<Vec<_>>()
            .join("\n")
    );
    (status, stdout, stderr)
}

/// The last `n` lines of a file, or why there are none.
fn tail(path: &std::path::Path, n: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("({e})"),
    }
}

fn cancelled(audit: &serde_json::Value, kind: &str) -> i64 {
    audit["commands"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r[0] == kind && r[1] == "cancelled")
        .map(|r| r[2].as_i64().unwrap())
        .sum()
}
