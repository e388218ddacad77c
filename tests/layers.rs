//! The structure of `src/` stays one-way: every `crate::` path in the code
//! of a file points down the layers, and no files import each other in a
//! loop (directly or through others).
//!
//! The layers, top down (`src/lib.rs` documents them too):
//!
//! ```text
//! lib.rs -> client.rs -> kinds/ -> engine/ -> scripts.rs -> net/ -> error.rs, time.rs,
//!     events.rs, metrics.rs
//! ```
//!
//! Inside a layer a file may use another, as long as no loop forms. A new
//! file or folder gets a place in [`LAYERS`] first. The check reads the
//! source as text: comments (doc links included) are not imports, and a
//! `#[cfg(test)]` module at the end of a file is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Each layer, top first: a file (`client.rs`) or a folder (`kinds/`) of
/// `src/`, and what it may not import (every layer above it).
const LAYERS: &[&[&str]] = &[
    &["lib.rs"],
    &["client.rs"],
    &["kinds/"],
    &["engine/"],
    &["scripts.rs"],
    &["net/"],
    &["error.rs", "time.rs", "events.rs", "metrics.rs"],
];

/// The layer of `file` (a path under `src/`, with `/`), 0 for the top.
fn layer_of(file: &str) -> Option<usize> {
    LAYERS.iter().position(|places| {
        places.iter().any(|p| {
            if p.ends_with('/') {
                file.starts_with(p)
            } else {
                file == *p
            }
        })
    })
}

/// The module path of `file` (`kinds/lock.rs` -> `["kinds", "lock"]`).
fn module_of(file: &str) -> Vec<String> {
    let stem = file.trim_end_matches(".rs");
    let mut parts: Vec<String> = stem.split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The source without comments and without a trailing `#[cfg(test)]`
/// module.
fn code_of(source: &str) -> String {
    let source = match source.find("#[cfg(test)]\nmod tests") {
        Some(at) => &source[..at],
        None => source,
    };
    let mut out = String::with_capacity(source.len());
    for line in source.lines() {
        let code = match line.find("//") {
            // "//" inside a string ("redis://...") is not a comment.
            Some(at) if line[..at].matches('"').count() % 2 == 0 => &line[..at],
            _ => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Every path that `code` (of module `module`) names through `crate::`,
/// `$crate::` or `super::`, as module paths from the crate root, with
/// `use` groups (`a::{b, c::d}`) expanded.
fn paths_in(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &code[i..];
        let boundary = i == 0 || !is_ident(bytes[i - 1]);
        let start = if !boundary {
            None
        } else if rest.starts_with("crate::") && (i == 0 || bytes[i - 1] != b'$') {
            Some((Vec::new(), "crate::".len()))
        } else if rest.starts_with("$crate::") {
            Some((Vec::new(), "$crate::".len()))
        } else if rest.starts_with("super::") {
            let mut base = module.to_vec();
            base.pop();
            Some((base, "super::".len()))
        } else {
            None
        };
        match start {
            Some((base, skip)) => {
                let (paths, used) = parse_tree(&code[i + skip..], base);
                found.extend(paths);
                i += skip + used.max(1);
            }
            None => i += 1,
        }
    }
    found
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Parses `a::b::{c, d::e}` (after a `crate::`) into full paths from
/// `base`; returns them and the bytes read.
fn parse_tree(text: &str, base: Vec<String>) -> (Vec<Vec<String>>, usize) {
    let bytes = text.as_bytes();
    let mut path = base;
    let mut i = 0;
    loop {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i < bytes.len() && bytes[i] == b'{' {
            i += 1;
            let mut all = Vec::new();
            loop {
                while i < bytes.len() && (bytes[i].is_ascii_whitespace() || bytes[i] == b',') {
                    i += 1;
                }
                if i >= bytes.len() || bytes[i] == b'}' {
                    return (all, i + 1);
                }
                let (inner, used) = parse_tree(&text[i..], path.clone());
                all.extend(inner);
                i += used.max(1);
            }
        }
        let start = i;
        while i < bytes.len() && is_ident(bytes[i]) {
            i += 1;
        }
        let segment = &text[start..i];
        if !segment.is_empty() && segment != "self" {
            path.push(segment.to_owned());
        }
        if text[i..].starts_with("::") {
            i += 2;
        } else {
            return (vec![path], i);
        }
    }
}

/// The file a path lands in: the longest prefix of it that is a module of
/// `files`, else the crate root (an item re-exported by `lib.rs`).
fn target_of(path: &[String], modules: &BTreeMap<Vec<String>, String>) -> String {
    (0..=path.len())
        .rev()
        .find_map(|n| modules.get(&path[..n]))
        .cloned()
        .unwrap_or_else(|| "lib.rs".to_owned())
}

/// What breaks the rule in `files` (path under `src/` -> source): each an
/// upward import, a loop, or a file in no layer.
fn check(files: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    let modules: BTreeMap<Vec<String>, String> =
        files.keys().map(|f| (module_of(f), f.clone())).collect();
    let mut edges: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (file, source) in files {
        let Some(from) = layer_of(file) else {
            problems.push(format!(
                "src/{file} is in no layer: give it a place in LAYERS (tests/layers.rs) and \
                 in the layer docs of src/lib.rs"
            ));
            continue;
        };
        let module = module_of(file);
        for path in paths_in(&code_of(source), &module) {
            let target = target_of(&path, &modules);
            if &target == file {
                continue;
            }
            if let Some(to) = layer_of(&target) {
                if to < from {
                    problems.push(format!(
                        "src/{file} imports crate::{} from src/{target}, a layer above it \
                         ({} over {}): move what both need down, or have the upper layer \
                         pass it in",
                        path.join("::"),
                        LAYERS[to].join(", "),
                        LAYERS[from].join(", "),
                    ));
                }
            }
            edges.entry(file.as_str()).or_default().insert(target);
        }
    }
    problems.extend(loops(&edges));
    problems
}

/// The import loops among files (one message per strongly connected group
/// of more than one file).
fn loops(edges: &BTreeMap<&str, BTreeSet<String>>) -> Vec<String> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_owned()];
        while let Some(f) = todo.pop() {
            for t in edges.get(f.as_str()).into_iter().flatten() {
                if seen.insert(t.clone()) {
                    todo.push(t.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&str, BTreeSet<String>> = edges.keys().map(|f| (*f, reach(f))).collect();
    let mut reported = BTreeSet::new();
    let mut problems = Vec::new();
    for (file, seen) in &reached {
        if reported.contains(*file) || !seen.contains(*file) {
            continue;
        }
        let group: Vec<&str> = reached
            .iter()
            .filter(|(other, other_seen)| seen.contains(**other) && other_seen.contains(*file))
            .map(|(other, _)| *other)
            .collect();
        reported.extend(group.iter().map(|f| f.to_string()));
        problems.push(format!(
            "these files import each other in a loop: {}; move what they share into a file \
             below them all",
            group
                .iter()
                .map(|f| format!("src/{f}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    problems
}

fn read_tree(dir: &Path, under: &str, out: &mut BTreeMap<String, String>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            read_tree(&path, &format!("{under}{name}/"), out);
        } else if name.ends_with(".rs") {
            let source = fs::read_to_string(&path).expect("a source file");
            out.insert(format!("{under}{name}"), source);
        }
    }
}

#[test]
fn imports_point_down_the_layers_and_never_loop() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    read_tree(&src, "", &mut files);
    assert!(
        files.len() > 20,
        "read only {} files from {}",
        files.len(),
        src.display()
    );
    let problems = check(&files);
    assert!(
        problems.is_empty(),
        "the layers of src/ are broken:\n- {}",
        problems.join("\n- ")
    );
}

fn tree(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(f, s)| (f.to_string(), s.to_string()))
        .collect()
}

#[test]
fn the_check_finds_an_upward_import() {
    let files = tree(&[
        (
            "lib.rs",
            "mod client;\nmod net;\npub use crate::client::Client;\n",
        ),
        (
            "client.rs",
            "use crate::net::pool::Redis;\npub struct Client;\n",
        ),
        ("net/mod.rs", "pub(crate) mod pool;\n"),
        (
            "net/pool.rs",
            "//! Uses [`crate::client::Client`] in a doc: fine.\n\
             pub(crate) struct Redis;\n\
             fn f() -> crate::client::Client { todo!() }\n",
        ),
    ]);
    let problems = check(&files);
    assert!(
        problems
            .iter()
            .any(|p| p
                .starts_with("src/net/pool.rs imports crate::client::Client from src/client.rs")),
        "{problems:?}"
    );
    // The doc link alone would not count: one upward import, one loop.
    assert_eq!(problems.len(), 2, "{problems:?}");
}

#[test]
fn the_check_finds_a_loop_inside_a_layer_and_through_groups() {
    let files = tree(&[
        ("lib.rs", "mod engine;\n"),
        (
            "engine/mod.rs",
            "pub(crate) mod a;\npub(crate) mod b;\npub(crate) mod c;\n",
        ),
        ("engine/a.rs", "use crate::engine::{b::B, c};\n"),
        ("engine/b.rs", "pub(crate) struct B;\n"),
        ("engine/c.rs", "use super::a::A;\n"),
    ]);
    let problems = check(&files);
    assert_eq!(
        problems,
        [
            "these files import each other in a loop: src/engine/a.rs, src/engine/c.rs; move what \
          they share into a file below them all"
        ],
    );
}

#[test]
fn the_check_finds_a_file_in_no_layer_and_root_paths() {
    let files = tree(&[
        ("lib.rs", "mod net;\nmod extra;\npub use crate::net::X;\n"),
        (
            "net/mod.rs",
            "pub(crate) struct X;\nfn f() -> crate::Error { todo!() }\n",
        ),
        ("extra.rs", "\n"),
    ]);
    let problems = check(&files);
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(problems[0].starts_with("src/extra.rs is in no layer"));
    assert!(problems[1].starts_with("src/net/mod.rs imports crate::Error from src/lib.rs"));
    assert!(problems[2].contains("loop: src/lib.rs, src/net/mod.rs"));
}
