//! The files of `src/node/` import one another in one direction only, as
//! the `# Layers` list in the module doc of `src/node/mod.rs` says: a file
//! may use a file of a lower layer, never one of its own layer or above.
//! An arrow that points up is the first half of an import cycle (the kind
//! `event_loop` ↔ `handle` ↔ `replica` once had); this test refuses it
//! when it is written, and refuses a file the list does not place.
//!
//! What counts as a use: in code (not comments, not a file's trailing
//! `#[cfg(test)]` module, which may use anything), a path from the file
//! up to `node` (`super::x` in `node/a.rs` and `node/a/mod.rs`,
//! `super::super::x` in `node/a/b.rs`) or `crate::node::x`, plain or as a
//! `{…}` group, where `x` is a file of `node` or an item `node/mod.rs`
//! re-exports from one (`super::NodeHandle` is a use of `handle`).
//!
//! Each check is a function over text, so the tests below also show it
//! failing on a planted back-arrow, an unplaced file and an unknown name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `src/node/` as text: `mod.rs`, and every other file with the node
/// module it belongs to and how deep below `src/node/` it is (0 for
/// `a.rs` and `a/mod.rs`, 1 for `a/b.rs`).
struct Tree {
    mod_rs: String,
    files: Vec<File>,
}

struct File {
    path: String,
    module: String,
    depth: usize,
    text: String,
}

fn read_tree() -> Tree {
    let node = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/node");
    let mut files = Vec::new();
    walk(&node, &node, &mut files);
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let mod_rs = std::fs::read_to_string(node.join("mod.rs")).expect("src/node/mod.rs");
    Tree { mod_rs, files }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<File>) {
    for entry in std::fs::read_dir(dir).expect("read src/node") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            walk(root, &path, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = path.strip_prefix(root).expect("below src/node");
        let parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if parts == ["mod.rs"] {
            continue;
        }
        let module = parts[0].trim_end_matches(".rs").to_string();
        let last = parts.last().expect("a file name");
        // a/mod.rs sits where a.rs would: depth 0.
        let depth = parts.len() - 1 - usize::from(last == "mod.rs" && parts.len() > 1);
        out.push(File {
            path: format!("src/node/{}", parts.join("/")),
            module,
            depth,
            text: std::fs::read_to_string(&path).expect("read a node file"),
        });
    }
}

/// The `# Layers` list of a module doc: each module with its layer.
fn layers(mod_rs: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut inside = false;
    for line in mod_rs.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            continue;
        };
        let doc = doc.trim();
        if doc.starts_with('#') {
            inside = doc == "# Layers";
            continue;
        }
        if !inside {
            continue;
        }
        let Some((n, rest)) = doc.split_once(". ") else {
            continue;
        };
        let Ok(n) = n.parse::<usize>() else {
            continue;
        };
        let names = rest.split_once(": ").map_or(rest, |(names, _)| names);
        for name in names.split(',') {
            let name = name.trim().trim_matches('`');
            if !name.is_empty() {
                out.insert(name.to_string(), n);
            }
        }
    }
    out
}

/// The modules `mod.rs` declares (`mod a;`, `pub mod a;`, `pub(crate) mod a;`).
fn declared(mod_rs: &str) -> BTreeSet<String> {
    mod_rs
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l
                .strip_prefix("pub(crate) ")
                .or_else(|| l.strip_prefix("pub "))
                .unwrap_or(l);
            let name = rest.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.to_string())
        })
        .collect()
}

/// What `mod.rs` re-exports: item name -> the module it comes from.
fn reexports(mod_rs: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let code = code_of(mod_rs);
    let mut rest = code.as_str();
    while let Some(at) = rest.find("pub use ") {
        rest = &rest[at + "pub use ".len()..];
        let end = rest.find(';').expect("a use ends with ;");
        let stmt = &rest[..end];
        rest = &rest[end..];
        let Some((module, items)) = stmt.split_once("::") else {
            continue;
        };
        let items = items.trim().trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let name = match item.split_once(" as ") {
                Some((_, alias)) => alias.trim(),
                None => item.rsplit("::").next().expect("a name"),
            };
            out.insert(name.to_string(), module.trim().to_string());
        }
    }
    out
}

/// `text` without comments and without the trailing `#[cfg(test)]` module.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.contains("mod ") && next.ends_with('{'))
        {
            break;
        }
        let code = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Every node-level name `code` uses through `prefix` (`super::`,
/// `super::super::`, `crate::node::`): the first segment after it, or the
/// first segment of each element of a `{…}` group after it.
fn names_after(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find(prefix) {
        let start = from + at;
        from = start + prefix.len();
        // `super::super::x` is not a `super::` path to `super`; nor is
        // `$crate::node::` or `a::super::` (there is none) another prefix.
        let before = code[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut element = String::new();
            let mut elements = Vec::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        elements.push(std::mem::take(&mut element));
                        continue;
                    }
                    _ => {}
                }
                element.push(c);
            }
            elements.push(element);
            for e in elements {
                let e = e.trim();
                let first: String = e
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !first.is_empty() {
                    out.push(first);
                }
            }
        } else {
            let first: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !first.is_empty() {
                out.push(first);
            }
        }
    }
    out
}

/// The arrows between node modules (user, used) and every way the tree
/// breaks the documented layering, one sentence each.
fn check(tree: &Tree) -> (BTreeSet<(String, String)>, Vec<String>) {
    let layer = layers(&tree.mod_rs);
    let modules = declared(&tree.mod_rs);
    let reexported = reexports(&tree.mod_rs);
    let mut problems = Vec::new();
    for m in &modules {
        if !layer.contains_key(m) {
            problems.push(format!(
                "src/node/mod.rs declares `{m}`, which no layer of its `# Layers` list places"
            ));
        }
    }
    for m in layer.keys() {
        if !modules.contains(m) {
            problems.push(format!(
                "the `# Layers` list places `{m}`, which src/node/mod.rs does not declare"
            ));
        }
    }
    let mut arrows = BTreeSet::new();
    for f in &tree.files {
        let code = code_of(&f.text);
        let up = "super::".repeat(f.depth + 1);
        let mut names = names_after(&code, &up);
        names.extend(names_after(&code, "crate::node::"));
        for name in names {
            let used = if modules.contains(&name) {
                name.clone()
            } else if let Some(m) = reexported.get(&name) {
                m.clone()
            } else {
                problems.push(format!(
                    "{} uses `{name}` of node, which is neither a file of node nor an item node/mod.rs re-exports from one",
                    f.path
                ));
                continue;
            };
            if used == f.module {
                continue;
            }
            arrows.insert((f.module.clone(), used.clone()));
            if let (Some(&from), Some(&to)) = (layer.get(&f.module), layer.get(&used)) {
                if to >= from {
                    problems.push(format!(
                        "{} (`{}`, layer {from}) uses `{used}` (layer {to}): an arrow must point to a lower layer",
                        f.path, f.module
                    ));
                }
            }
        }
    }
    problems.sort();
    problems.dedup();
    (arrows, problems)
}

/// The tree with `line` added at the top of the file at `path`.
fn planted(mut tree: Tree, path: &str, line: &str) -> Tree {
    let f = tree
        .files
        .iter_mut()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("{path} is not in the tree"));
    f.text = format!("{line}\n{}", f.text);
    tree
}

#[test]
fn node_imports_point_down_the_documented_layers() {
    let tree = read_tree();
    let (arrows, problems) = check(&tree);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Not vacuous: the arrows the layering is about are seen.
    for (from, to) in [
        ("handle", "event_loop"),
        ("event_loop", "replica"),
        ("event_loop", "control"),
        ("control", "mesh"),
        ("replica", "command"),
        ("replica", "status"),
        ("command", "status"),
        ("daemon", "handle"), // through the re-export `super::NodeHandle`
        ("client_server", "client_conns"),
        ("client_conns", "client_dispatch"),
        ("event_loop", "client_conns"),
        ("mesh", "command"),
        ("client_dispatch", "command"),
    ] {
        assert!(
            arrows.contains(&(from.to_string(), to.to_string())),
            "the check no longer sees {from} -> {to}"
        );
    }
    // Every file of every layer is read.
    assert!(tree
        .files
        .iter()
        .any(|f| f.path == "src/node/replica/mod.rs"));
    assert!(tree
        .files
        .iter()
        .any(|f| f.path == "src/node/replica/reads.rs"));
}

#[test]
fn a_back_arrow_is_refused() {
    // A replica that reaches up to the handle: the old cycle's shape.
    let tree = planted(
        read_tree(),
        "src/node/replica/machine.rs",
        "use super::super::handle::NodeHandle;",
    );
    let (_, problems) = check(&tree);
    assert_eq!(
        problems,
        ["src/node/replica/machine.rs (`replica`, layer 5) uses `handle` (layer 8): an arrow must point to a lower layer"]
    );
    // Through a re-export, in a group, and through crate::node.
    for (path, line) in [
        ("src/node/command.rs", "use super::NodeHandle;"),
        (
            "src/node/status.rs",
            "use super::{client_stats::ClientView, event_loop::EventLoop};",
        ),
        (
            "src/node/replica/snapshot.rs",
            "fn f() { crate::node::control::Control::tick; }",
        ),
        // Same layer counts too: replica and control are both layer 5.
        ("src/node/control.rs", "use super::replica::Replica;"),
    ] {
        let (_, problems) = check(&planted(read_tree(), path, line));
        assert_eq!(problems.len(), 1, "{line}: {problems:?}");
        assert!(problems[0].starts_with(path), "{problems:?}");
    }
}

#[test]
fn comments_and_test_modules_are_not_uses() {
    let tree = planted(
        read_tree(),
        "src/node/status.rs",
        "/// See [`NodeHandle`](super::NodeHandle). // and super::handle",
    );
    assert!(check(&tree).1.is_empty());
    let mut tree = read_tree();
    let f = tree
        .files
        .iter_mut()
        .find(|f| f.path == "src/node/waker.rs")
        .expect("waker.rs");
    f.text
        .push_str("\n#[cfg(test)]\nmod tests {\n    use super::super::handle::NodeHandle;\n}\n");
    assert!(check(&tree).1.is_empty());
}

#[test]
fn an_unplaced_file_and_an_unknown_name_are_refused() {
    let mut tree = read_tree();
    tree.mod_rs.push_str("\nmod scratch;\n");
    let (_, problems) = check(&tree);
    assert_eq!(
        problems,
        ["src/node/mod.rs declares `scratch`, which no layer of its `# Layers` list places"]
    );
    let tree = planted(read_tree(), "src/node/stall.rs", "use super::os_seed;");
    let (_, problems) = check(&tree);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("uses `os_seed` of node"),
        "{problems:?}"
    );
}
