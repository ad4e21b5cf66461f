//! `events list` prints what a sender chose (event ids and types) escaped: no
//! terminal control reaches the operator's screen.

use crate::helpers::spawn_app;

#[tokio::test]
async fn events_list_escapes_terminal_controls() {
    let app = spawn_app().await;
    app.client
        .batch_execute(
            "INSERT INTO processed_events (event_id, event_type, status, result)
             VALUES (E'evt_\\x1b[2J\\r\\u202e', E'payment.\\x1b[31msucceeded', 'unmatched', '{}')",
        )
        .await
        .unwrap();
    let url = &app.db.as_ref().unwrap().url;
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_webhook-ingest"))
            .args(args)
            .env("DATABASE_URL", url)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let table = run(&["events", "list"]);
    assert!(
        !table.contains(['\x1b', '\r', '\u{202e}']),
        "events list printed a control character: {table:?}"
    );
    assert!(table.contains("evt_\\u{1b}[2J\\u{d}\\u{202e}"), "{table}");
    let json = run(&["events", "list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert_eq!(v["event_id"], "evt_\x1b[2J\r\u{202e}");
}
