//! ARCHITECTURE.md's map of where things live matches the code: every file
//! and module its table names exists, every source file of the product
//! crates is named there, and the commands its `main.rs` rows list are the
//! binaries' commands, all of them and no others.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory as _;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The backticked names in `cell`.
fn ticked(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// The table's rows: (crate's folder, module cell, description cell), the
/// crate carried down from the row that names it.
fn rows() -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let table = text
        .split("| crate | module | what it holds |")
        .nth(1)
        .expect("the map of where things live");
    let mut crate_dir = String::new();
    let mut rows = Vec::new();
    for line in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.split(" | ").collect();
        let first = cells[0].trim_start_matches('|').trim();
        if let Some(dir) = ticked(first).first() {
            crate_dir = dir.trim_end_matches('/').to_owned();
        }
        rows.push((crate_dir.clone(), cells[1].to_owned(), cells[2..].join(" | ")));
    }
    rows
}

const PRODUCT: [&str; 7] = [
    "crates/domain",
    "crates/signature",
    "crates/db",
    "crates/process",
    "crates/webhook-ingest",
    "crates/outbox-relay",
    "crates/ops-console",
];

#[test]
fn every_module_the_map_names_exists_and_every_product_file_is_on_it() {
    let mut missing = Vec::new();
    let mut named = BTreeSet::new();
    for (crate_dir, modules, _) in rows() {
        if !PRODUCT.contains(&crate_dir.as_str()) {
            continue;
        }
        let src = root().join(&crate_dir).join("src");
        let mut folder = PathBuf::new();
        for name in ticked(&modules) {
            let path = Path::new(&name);
            if let Some(dir) = name.strip_suffix("/*.sql") {
                // `migrate/*.sql`: a folder of statements beside the module.
                let sql = std::fs::read_dir(src.join(dir)).map_or(0, |d| {
                    d.filter(|e| {
                        e.as_ref()
                            .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "sql"))
                    })
                    .count()
                });
                if sql == 0 {
                    missing.push(format!("{crate_dir}: `{name}`"));
                }
                continue;
            }
            let candidates: Vec<PathBuf> = if path.extension().is_some() {
                // `storage/dead.rs`, then `prune.rs` beside it; `record`
                // then `mod.rs` is that module's; `sql/count_due.sql` is
                // the crate's own folder.
                if name.contains('/') {
                    folder = path.parent().expect("a folder").to_path_buf();
                    vec![src.join(path), root().join(&crate_dir).join(path)]
                } else {
                    vec![src.join(path), src.join(&folder).join(path)]
                }
            } else {
                folder = PathBuf::from(&name);
                vec![src.join(format!("{name}.rs")), src.join(&name).join("mod.rs")]
            };
            match candidates.into_iter().find(|c| c.exists()) {
                Some(found) => {
                    named.insert(found.canonicalize().expect("a path"));
                }
                None => missing.push(format!("{crate_dir}: `{name}`")),
            }
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names what does not exist:\n{}",
        missing.join("\n")
    );

    // Every product source file: named itself, or inside a module folder
    // whose `mod.rs` is named (its submodules are that module's parts).
    let mut unnamed = Vec::new();
    for crate_dir in PRODUCT {
        let mut dirs = vec![root().join(crate_dir).join("src")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("a source folder") {
                let path = entry.expect("an entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let path = path.canonicalize().expect("a path");
                    let module_named = path
                        .parent()
                        .is_some_and(|folder| named.contains(&folder.join("mod.rs")));
                    let root_file = matches!(path.file_name().and_then(|n| n.to_str()), Some("lib.rs"));
                    if !named.contains(&path) && !module_named && !root_file {
                        unnamed.push(path.display().to_string());
                    }
                }
            }
        }
    }
    assert!(
        unnamed.is_empty(),
        "source files ARCHITECTURE.md does not name:\n{}",
        unnamed.join("\n")
    );
}

/// Every command path of `command`, as `dead list` (the default one is the
/// binary's root, not listed).
fn commands(command: &clap::Command) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for sub in command.get_subcommands() {
        let name = sub.get_name().to_owned();
        let subs = commands(sub);
        if subs.is_empty() {
            all.insert(name);
        } else {
            all.extend(subs.into_iter().map(|s| format!("{name} {s}")));
        }
    }
    all
}

#[test]
fn the_commands_the_map_lists_are_the_binaries_commands() {
    for (crate_dir, cli) in [
        ("crates/webhook-ingest", webhook_ingest::config::Cli::command()),
        ("crates/outbox-relay", outbox_relay::config::Cli::command()),
    ] {
        let listed: BTreeSet<String> = rows()
            .into_iter()
            .filter(|(dir, modules, _)| dir == crate_dir && ticked(modules) == ["main.rs"])
            .flat_map(|(_, _, what)| ticked(&what))
            .collect();
        assert!(!listed.is_empty(), "{crate_dir}: no main.rs row");
        assert_eq!(
            listed,
            commands(&cli),
            "{crate_dir}: ARCHITECTURE.md's commands against the binary's"
        );
    }
}
