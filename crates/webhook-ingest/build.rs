//! The claim-and-apply statements share their steps (`src/storage/steps/`):
//! each `-- include: <file>` line of a statement is replaced by that file,
//! its leading comment left out, and the statements are written to
//! `OUT_DIR`, where `include_str!` finds them. `record_event.sql` makes two:
//! a payment's, without its `-- include (refunds):` step, and a refund's,
//! with it.

use std::path::Path;

/// (statement written, its source, whether `(refunds)` steps are in it).
const STATEMENTS: [(&str, &str, bool); 3] = [
    ("record_event.sql", "record_event.sql", false),
    ("record_event_stopping_shipment.sql", "record_event.sql", true),
    ("replay_event.sql", "replay_event.sql", true),
];

fn main() {
    let storage = Path::new("src/storage");
    println!("cargo:rerun-if-changed=src/storage");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    for (written, source, refunds) in STATEMENTS {
        let text = read(&storage.join(source));
        let mut sql = String::with_capacity(text.len() * 2);
        for line in text.lines() {
            let step = match (
                line.strip_prefix("-- include: "),
                line.strip_prefix("-- include (refunds): "),
            ) {
                (Some(step), _) => Some(step),
                (None, Some(step)) => refunds.then_some(step),
                (None, None) if line.starts_with("-- include") => panic!("{source}: cannot read {line:?}"),
                (None, None) => {
                    sql.push_str(line);
                    sql.push('\n');
                    None
                }
            };
            if let Some(step) = step {
                let step = read(&storage.join(step));
                for l in step.lines().skip_while(|l| l.starts_with("--")) {
                    sql.push_str(l);
                    sql.push('\n');
                }
            }
        }
        std::fs::write(Path::new(&out).join(written), sql).expect("OUT_DIR is writable");
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
