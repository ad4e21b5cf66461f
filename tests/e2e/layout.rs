//! The product's shape, held as it grows: within each product crate, no
//! two files import each other, directly or round a loop (a file's module
//! uses another's, and that one, by some path, the first), and no source
//! file is longer than [`MOST_LINES`]. A loop is a room with two doors into
//! the same corridor: the reader follows a call out and back in, and no file
//! can be read, changed or tested on its own. And no test's function (in
//! `tests/`, a crate's `tests/`, or its unit tests) is longer than
//! [`MOST_TEST_LINES`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates the product is built of (not the simulator, the test kit or
/// these tests).
const PRODUCT: [&str; 7] = [
    "domain",
    "signature",
    "db",
    "process",
    "webhook-ingest",
    "outbox-relay",
    "ops-console",
];

/// The longest a product source file may be, its unit tests included.
const MOST_LINES: usize = 450;

#[test]
fn no_product_file_imports_another_in_a_loop_and_none_is_too_long() {
    let mut loops = Vec::new();
    let mut long = Vec::new();
    for name in PRODUCT {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../crates")
            .join(name)
            .join("src");
        let files = modules(&src);
        assert!(files.len() > 1, "{name}: no modules under {}", src.display());
        for file in files.values() {
            let lines = std::fs::read_to_string(file)
                .expect("a source file")
                .lines()
                .count();
            if lines > MOST_LINES {
                long.push(format!("{} ({lines} lines)", file.display()));
            }
        }
        let mut edges = imports(&files);
        // Every loop: each found is reported, then cut where it closes.
        while let Some(cycle) = a_loop(&edges) {
            loops.push(format!("{name}: {}", cycle.join(" -> ")));
            let last = &cycle[cycle.len() - 2];
            let key = edges
                .keys()
                .find(|k| &name_of(k) == last)
                .cloned()
                .expect("a module of the loop");
            let closing = edges
                .keys()
                .find(|k| name_of(k) == cycle[cycle.len() - 1])
                .cloned()
                .expect("a module of the loop");
            edges.get_mut(&key).expect("its edges").remove(&closing);
        }
    }
    assert!(
        loops.is_empty(),
        "files importing each other in a loop:\n{}",
        loops.join("\n")
    );
    assert!(
        long.is_empty(),
        "files over {MOST_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// Each file's module path (`["record", "batch"]` for `src/record/batch.rs`
/// and `[]` for `lib.rs` and `main.rs`'s own) and the file.
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).expect("under src");
            let mut segments: Vec<String> = relative
                .with_extension("")
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            if matches!(segments.last().map(String::as_str), Some("mod" | "lib")) {
                segments.pop();
            }
            if segments == ["main"] {
                // A binary's root: it reaches the library by the crate's
                // name, and declares no modules of its own.
                continue;
            }
            found.insert(segments, path);
        }
    }
    found
}

/// For each file, the files whose modules its code names (by `crate::`,
/// `super::`, `self::` or a child module's name), comments and the unit
/// tests at its end left out. A name a module re-exports (`pub use
/// pool::Pool` in `lib.rs`) leads to the file that defines it, not to the
/// module that passes it on.
fn imports(files: &BTreeMap<Vec<String>, PathBuf>) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut named = BTreeMap::new();
    let mut reexports = BTreeMap::new();
    for (module, file) in files {
        let text = std::fs::read_to_string(file).expect("a source file");
        let code: String = text
            .lines()
            .take_while(|line| line.trim() != "#[cfg(test)]")
            .map(|line| {
                if line.trim_start().starts_with("//") {
                    ""
                } else {
                    line
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let children: BTreeSet<String> = files
            .keys()
            .filter(|k| k.len() == module.len() + 1 && k.starts_with(module))
            .map(|k| k.last().expect("a child's name").clone())
            .collect();
        let absolute = |path: Vec<String>| absolute(module, &children, &path);
        for statement in code.split(';') {
            let statement = statement.trim_start();
            if statement.starts_with("pub use ") || statement.starts_with("pub(crate) use ") {
                for origin in paths(statement).into_iter().filter_map(absolute) {
                    let item = origin.last().expect("a path").clone();
                    reexports.insert((module.clone(), item), origin);
                }
            }
        }
        named.insert(
            module.clone(),
            paths(&code).into_iter().filter_map(absolute).collect::<Vec<_>>(),
        );
    }
    named
        .into_iter()
        .map(|(module, paths)| {
            let targets = paths
                .into_iter()
                .map(|path| resolve(files, &reexports, path))
                .filter(|target| target != &module)
                .collect();
            (module, targets)
        })
        .collect()
}

/// `path`, named in `module` (whose child modules are `children`), from
/// the crate's root; `None` if it names no module of this crate.
fn absolute(module: &[String], children: &BTreeSet<String>, path: &[String]) -> Option<Vec<String>> {
    let mut at = match path[0].as_str() {
        "crate" => Vec::new(),
        "self" => module.to_vec(),
        "super" => {
            let mut at = module.to_vec();
            at.pop();
            for _ in path.iter().skip(1).take_while(|s| *s == "super") {
                at.pop();
            }
            at
        }
        first if children.contains(first) => module.to_vec(),
        _ => return None,
    };
    at.extend(
        path.iter()
            .filter(|s| !matches!(s.as_str(), "crate" | "self" | "super"))
            .cloned(),
    );
    Some(at)
}

/// The file whose module defines what `path` names, through re-exports.
fn resolve(
    files: &BTreeMap<Vec<String>, PathBuf>,
    reexports: &BTreeMap<(Vec<String>, String), Vec<String>>,
    mut path: Vec<String>,
) -> Vec<String> {
    for _ in 0..8 {
        let mut module = path.clone();
        while !module.is_empty() && !files.contains_key(&module) {
            module.pop();
        }
        let rest = &path[module.len()..];
        match rest
            .first()
            .and_then(|item| reexports.get(&(module.clone(), item.clone())))
        {
            Some(origin) if origin != &path => path = [origin.clone(), rest[1..].to_vec()].concat(),
            _ => return module,
        }
    }
    path
}

/// Every path in `code` that starts a path (not one after `::`, nor a
/// macro's `$crate`, which is its caller's), each
/// `{...}` group expanded: `use super::{a::B, c}` gives `super::a::B` and
/// `super::c`.
fn paths(code: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = (chars[i].is_alphabetic() || chars[i] == '_')
            && (i == 0 || !(chars[i - 1].is_alphanumeric() || matches!(chars[i - 1], '_' | ':' | '$')));
        if starts {
            let (trees, end) = tree(&chars, i);
            out.extend(trees.into_iter().filter(|p| p.len() > 1));
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// The path (or group of paths) starting at `i`, and where it ends.
fn tree(chars: &[char], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    loop {
        let start = i;
        while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
            i += 1;
        }
        if i == start {
            if chars.get(i) == Some(&'*') {
                // A glob: the module itself.
                prefix.push("*".into());
            }
            break;
        }
        prefix.push(chars[start..i].iter().collect::<String>());
        if chars.get(i..i + 2) != Some(&[':', ':']) {
            return (vec![prefix], i);
        }
        i += 2;
        if chars.get(i) == Some(&'{') {
            let mut all = Vec::new();
            i += 1;
            loop {
                while chars.get(i).is_some_and(|c| c.is_whitespace() || *c == ',') {
                    i += 1;
                }
                if chars.get(i).is_none_or(|c| *c == '}') {
                    return (all, i + 1);
                }
                let (inner, end) = tree(chars, i);
                all.extend(inner.into_iter().map(|p| [prefix.clone(), p].concat()));
                // `as` renames and anything else up to the next item.
                i = end;
                while chars.get(i).is_some_and(|c| *c != ',' && *c != '}') {
                    i += 1;
                }
            }
        }
    }
    (vec![prefix], i)
}

/// A module's name in a report: its path, or `lib` for the crate's root.
fn name_of(module: &[String]) -> String {
    if module.is_empty() {
        "lib".into()
    } else {
        module.join("::")
    }
}

/// A loop in the import graph, as the files round it, or `None`.
fn a_loop(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<String>> {
    fn visit(
        at: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        stack: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
    ) -> Option<Vec<String>> {
        if let Some(from) = stack.iter().position(|m| m == at) {
            let mut cycle: Vec<String> = stack[from..].iter().map(|m| name_of(m)).collect();
            cycle.push(name_of(at));
            return Some(cycle);
        }
        if !done.insert(at.clone()) {
            return None;
        }
        stack.push(at.clone());
        for next in edges.get(at).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|start| visit(start, edges, &mut Vec::new(), &mut done))
}

#[test]
fn the_check_sees_a_loop_through_a_parent_and_a_group_import() {
    let code = "use super::{queue::Job, statement::{Received, Statements}};\nuse self::batch::*;\nlet x = crate::http::AppState;";
    let found = paths(code);
    assert!(
        found.contains(&vec!["super".into(), "queue".into(), "Job".into()]),
        "{found:?}"
    );
    assert!(
        found.contains(&vec!["super".into(), "statement".into(), "Statements".into()]),
        "{found:?}"
    );
    assert!(
        found.contains(&vec!["crate".into(), "http".into(), "AppState".into()]),
        "{found:?}"
    );
    assert!(
        found.contains(&vec!["self".into(), "batch".into(), "*".into()]),
        "{found:?}"
    );
    let edge = |a: &[&str], b: &[&[&str]]| {
        (
            a.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            b.iter()
                .map(|m| m.iter().map(|s| s.to_string()).collect())
                .collect::<BTreeSet<Vec<String>>>(),
        )
    };
    let graph: BTreeMap<_, _> = [
        edge(&["http"], &[&["batch"]]),
        edge(&["batch"], &[&["http"], &["storage"]]),
        edge(&["storage"], &[]),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        a_loop(&graph),
        Some(vec!["batch".into(), "http".into(), "batch".into()])
    );
    let graph: BTreeMap<_, _> = [edge(&["http"], &[&["batch"]]), edge(&["batch"], &[&["storage"]])]
        .into_iter()
        .collect();
    assert_eq!(a_loop(&graph), None);
}

/// The longest a test's function may be: past that, a test reads as its
/// steps, each a function named for what it holds.
const MOST_TEST_LINES: usize = 150;

#[test]
fn no_test_function_is_too_long() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf();
    let mut files = Vec::new();
    rust_files(&root.join("tests"), &mut files);
    for entry in std::fs::read_dir(root.join("crates")).expect("the crates") {
        let krate = entry.expect("a crate").path();
        rust_files(&krate.join("tests"), &mut files);
        rust_files(&krate.join("src"), &mut files);
    }
    let mut long = Vec::new();
    for file in files {
        let code = std::fs::read_to_string(&file).expect("a source file");
        let relative = file.strip_prefix(&root).expect("a file of the workspace");
        let tests_from = if relative.components().any(|c| c.as_os_str() == "tests")
            || file.file_name().is_some_and(|n| n == "tests.rs")
        {
            0
        } else {
            match code.lines().position(|l| l.trim() == "#[cfg(test)]") {
                Some(at) => at,
                None => continue,
            }
        };
        for (name, lines) in functions(&code)
            .into_iter()
            .filter(|(_, _, at)| *at >= tests_from)
            .map(|(n, l, _)| (n, l))
        {
            if lines > MOST_TEST_LINES {
                long.push(format!("{}: {name} ({lines} lines)", file.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "test functions over {MOST_TEST_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// Every `.rs` file under `dir`, if it exists.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Each function of `code` (formatted by rustfmt): its name, its length in
/// lines, and the line it starts on. It ends at the first line that is its
/// own indentation and `}`.
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let signature = [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "async ",
            "const ",
            "unsafe ",
        ]
        .iter()
        .fold(trimmed, |rest, prefix| rest.strip_prefix(prefix).unwrap_or(rest));
        let signature = signature.strip_prefix("async ").unwrap_or(signature);
        let Some(rest) = signature.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let end = format!("{indent}}}");
        if let Some(length) = lines[at..].iter().position(|l| *l == end) {
            found.push((name, length + 1, at));
        }
    }
    found
}

#[test]
fn the_length_check_measures_a_function_to_its_closing_brace() {
    let code = "fn short() {\n    one();\n}\n\n#[cfg(test)]\nmod tests {\n    #[tokio::test]\n    async fn long() {\n        if x {\n        }\n    }\n}\n";
    let found = functions(code);
    assert_eq!(found, [("short".to_owned(), 3, 0), ("long".to_owned(), 4, 7)]);
}
