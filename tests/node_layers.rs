//! The files of `src/node/` import one another in one direction only, as
//! the `# Layers` list in the module doc of `src/node/mod.rs` says: a file
//! may use a file of a lower layer, never one of its own layer or above.
//! An arrow that points up is the first half of an import cycle (the kind
//! `event_loop` ↔ `handle` ↔ `replica` once had); this test refuses it
//! when it is written, and refuses a file the list does not place.
//!
//! The list names *units*: a file at the top of `node` (`log`), a file of
//! a folder named for a noun (`client/conns`: a folder whose `mod.rs`
//! only declares its files), or a folder that is one unit with its
//! private parts (`replica`, whose `mod.rs` has code; `daemon/config_file`,
//! a file with files of its own).
//!
//! What counts as a use: in code (not comments, not a file's trailing
//! `#[cfg(test)]` module, which may use anything), a path that reaches a
//! unit of `node`: `crate::node::a::b`, or `super::…::x` from the file's
//! own module, plain or as a `{…}` group (`super::conns` in
//! `client/routing.rs` is a use of `client/conns`), or an item
//! `node/mod.rs` re-exports from a unit (`crate::node::NodeHandle` is a
//! use of `loops/handle`).
//!
//! Each check is a function over text, so the tests below also show it
//! failing on a planted back-arrow, an unplaced file and an unknown name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `src/node/` as text: every file with its path below `src/node/`.
struct Tree {
    files: BTreeMap<String, String>,
}

impl Tree {
    fn mod_rs(&self) -> &str {
        &self.files["mod.rs"]
    }
}

fn read_tree() -> Tree {
    let node = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/node");
    let mut files = BTreeMap::new();
    walk(&node, &node, &mut files);
    Tree { files }
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).expect("read src/node") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            walk(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(root).expect("below src/node");
            let rel = rel
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.insert(
                rel,
                std::fs::read_to_string(&path).expect("read a node file"),
            );
        }
    }
}

/// The `# Layers` list of a module doc: each unit with its layer.
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

/// The modules a file declares (`mod a;`, `pub mod a;`, `pub(…) mod a;`).
fn declared(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = match l.strip_prefix("pub") {
                Some(r) if r.starts_with('(') => r.split_once(") ")?.1,
                Some(r) => r.strip_prefix(' ')?,
                None => l,
            };
            let name = rest.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.to_string())
        })
        .collect()
}

/// True if `text` is a noun folder's `mod.rs`: docs and `mod` lines only.
fn only_declares(text: &str) -> bool {
    code_of(text).lines().all(|l| {
        let l = l.trim();
        l.is_empty() || !declared(l).is_empty()
    })
}

/// The units of the tree: every module of `node/mod.rs`, each noun
/// folder's modules in its place.
struct Units {
    /// Noun folder -> its `mod.rs` declares only.
    folders: BTreeSet<String>,
    units: BTreeSet<String>,
    /// Item `node/mod.rs` re-exports -> the unit it comes from.
    reexported: BTreeMap<String, String>,
}

impl Units {
    fn of(tree: &Tree) -> Units {
        let mut folders = BTreeSet::new();
        let mut units = BTreeSet::new();
        for m in declared(tree.mod_rs()) {
            match tree.files.get(&format!("{m}/mod.rs")) {
                Some(text) if only_declares(text) => {
                    for c in declared(text) {
                        units.insert(format!("{m}/{c}"));
                    }
                    folders.insert(m);
                }
                _ => {
                    units.insert(m);
                }
            }
        }
        let mut u = Units {
            folders,
            units,
            reexported: BTreeMap::new(),
        };
        for (item, path) in reexports(tree.mod_rs()) {
            if let Some(unit) = u.unit_of_path(&path) {
                u.reexported.insert(item, unit);
            }
        }
        u
    }

    /// The unit a path from `node` (its segments) names, if any.
    fn unit_of_path(&self, segments: &[String]) -> Option<String> {
        let first = segments.first()?;
        if self.folders.contains(first) {
            let unit = format!("{first}/{}", segments.get(1)?);
            return self.units.contains(&unit).then_some(unit);
        }
        if self.units.contains(first) {
            return Some(first.clone());
        }
        self.reexported.get(first).cloned()
    }

    /// A file's module path below `node` (`client/conns.rs` ->
    /// [client, conns]; `replica/mod.rs` -> [replica]) and its unit.
    fn file(&self, path: &str) -> (Vec<String>, Option<String>) {
        let mut module: Vec<String> = path
            .trim_end_matches(".rs")
            .split('/')
            .map(String::from)
            .collect();
        if module.last().is_some_and(|l| l == "mod") {
            module.pop();
        }
        let unit = self.unit_of_path(&module);
        (module, unit)
    }
}

/// What `mod.rs` re-exports: item name -> the path it comes from.
fn reexports(mod_rs: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let code = code_of(mod_rs);
    let mut rest = code.as_str();
    while let Some(at) = rest.find("pub use ") {
        rest = &rest[at + "pub use ".len()..];
        let end = rest.find(';').expect("a use ends with ;");
        for path in paths(&rest[..end]) {
            let (item, from) = path.split_last().expect("a path");
            out.push((item.clone(), from.to_vec()));
        }
        rest = &rest[end..];
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

/// The paths a use tree at the start of `s` spells (`a::{b::c, d}` ->
/// [a, b, c], [a, d]), each as far as its identifiers go.
fn paths(s: &str) -> Vec<Vec<String>> {
    fn skip_ws(s: &[u8], i: &mut usize) {
        while *i < s.len() && s[*i].is_ascii_whitespace() {
            *i += 1;
        }
    }
    fn tree(s: &[u8], i: &mut usize, mut path: Vec<String>, out: &mut Vec<Vec<String>>) {
        skip_ws(s, i);
        if s.get(*i) == Some(&b'{') {
            *i += 1;
            loop {
                skip_ws(s, i);
                if s.get(*i) == Some(&b'}') {
                    *i += 1;
                    return;
                }
                tree(s, i, path.clone(), out);
                skip_ws(s, i);
                match s.get(*i) {
                    Some(b',') => *i += 1,
                    Some(b'}') => {
                        *i += 1;
                        return;
                    }
                    _ => return,
                }
            }
        }
        let start = *i;
        while *i < s.len() && (s[*i].is_ascii_alphanumeric() || s[*i] == b'_') {
            *i += 1;
        }
        if *i == start {
            if !path.is_empty() {
                out.push(path);
            }
            return;
        }
        path.push(String::from_utf8_lossy(&s[start..*i]).into_owned());
        if s[*i..].starts_with(b"::") {
            *i += 2;
            tree(s, i, path, out);
        } else {
            out.push(path);
        }
    }
    let mut out = Vec::new();
    tree(s.as_bytes(), &mut 0, Vec::new(), &mut out);
    out
}

/// Every path `code` takes into `node`, from the file at `module`: each
/// `crate::node::…` and each `super::…` chain, as segments from `node`.
fn node_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut from = 0;
    while from < code.len() {
        let rest = &code[from..];
        let (at, prefix) = match (rest.find("crate::node::"), rest.find("super::")) {
            (Some(a), Some(b)) if a < b => (a, "crate::node::"),
            (Some(a), None) => (a, "crate::node::"),
            (_, Some(b)) => (b, "super::"),
            (None, None) => break,
        };
        let start = from + at;
        from = start + prefix.len();
        // `$crate::node::`, `a::super::`: not the start of a path.
        let before = code[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '$') {
            continue;
        }
        let mut base: Vec<String> = Vec::new();
        if prefix == "super::" {
            let mut ups = 1;
            while code[from..].starts_with("super::") {
                from += "super::".len();
                ups += 1;
            }
            if ups > module.len() {
                continue; // above `node`
            }
            base = module[..module.len() - ups].to_vec();
        }
        for p in paths(&code[from..]) {
            let mut full = base.clone();
            full.extend(p);
            out.push(full);
        }
    }
    out
}

/// The arrows between node units (user, used) and every way the tree
/// breaks the documented layering, one sentence each.
fn check(tree: &Tree) -> (BTreeSet<(String, String)>, Vec<String>) {
    let layer = layers(tree.mod_rs());
    let units = Units::of(tree);
    let mut problems = Vec::new();
    for u in &units.units {
        if !layer.contains_key(u) {
            problems.push(format!(
                "src/node declares `{u}`, which no layer of the `# Layers` list in src/node/mod.rs places"
            ));
        }
    }
    for u in layer.keys() {
        if !units.units.contains(u) {
            problems.push(format!(
                "the `# Layers` list places `{u}`, which src/node does not declare"
            ));
        }
    }
    let mut arrows = BTreeSet::new();
    for (path, text) in &tree.files {
        if path == "mod.rs" || units.folders.contains(path.trim_end_matches("/mod.rs")) {
            continue;
        }
        let (module, Some(own)) = units.file(path) else {
            problems.push(format!(
                "src/node/{path} belongs to no unit that src/node declares"
            ));
            continue;
        };
        for used_path in node_paths(&code_of(text), &module) {
            let Some(used) = units.unit_of_path(&used_path) else {
                problems.push(format!(
                    "src/node/{path} uses `{}` of node, which is neither a unit of node nor an item node/mod.rs re-exports from one",
                    used_path.join("::")
                ));
                continue;
            };
            if used == own {
                continue; // inside its unit: `super::machine` in replica/reads.rs
            }
            arrows.insert((own.clone(), used.clone()));
            if let (Some(&from), Some(&to)) = (layer.get(&own), layer.get(&used)) {
                if to >= from {
                    problems.push(format!(
                        "src/node/{path} (`{own}`, layer {from}) uses `{used}` (layer {to}): an arrow must point to a lower layer"
                    ));
                }
            }
        }
    }
    problems.sort();
    problems.dedup();
    (arrows, problems)
}

/// The tree with `line` added at the top of the file at `path` (below
/// `src/node/`).
fn planted(mut tree: Tree, path: &str, line: &str) -> Tree {
    let text = tree
        .files
        .get_mut(path)
        .unwrap_or_else(|| panic!("{path} is not in the tree"));
    *text = format!("{line}\n{text}");
    tree
}

#[test]
fn node_imports_point_down_the_documented_layers() {
    let tree = read_tree();
    let (arrows, problems) = check(&tree);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Not vacuous: the arrows the layering is about are seen.
    for (from, to) in [
        ("loops/handle", "loops/event_loop"),
        ("loops/open", "replica"),
        ("loops/event_loop", "loops/control"),
        ("loops/control", "mesh"),
        ("replica", "command"),
        ("replica", "status"),
        ("command", "status"),
        ("daemon/quired", "loops/handle"), // through the re-export `NodeHandle`
        ("client/server", "client/conns"),
        ("client/routing", "client/dispatch"),
        ("client/routing", "client/conns"), // `super::conns`, a sibling
        ("loops/event_loop", "client/conns"),
        ("mesh", "command"),
        ("client/dispatch", "command"),
        ("admin/metrics", "admin/group_metrics"),
    ] {
        assert!(
            arrows.contains(&(from.to_string(), to.to_string())),
            "the check no longer sees {from} -> {to}"
        );
    }
    // Every file of every unit is read.
    for f in [
        "replica/mod.rs",
        "replica/reads.rs",
        "daemon/config_file/placement.rs",
    ] {
        assert!(tree.files.contains_key(f), "{f}");
    }
}

#[test]
fn use_trees_are_read_whole() {
    let got = paths("a::{b::c, d::{e, f::G}}, h;");
    let want: Vec<Vec<String>> = [
        vec!["a", "b", "c"],
        vec!["a", "d", "e"],
        vec!["a", "d", "f", "G"],
    ]
    .iter()
    .map(|p| p.iter().map(|s| s.to_string()).collect())
    .collect();
    assert_eq!(got, want);
    let module = ["client".to_string(), "routing".to_string()];
    assert_eq!(
        node_paths("use super::super::log::x; use super::conns::Y;", &module),
        [vec!["log", "x"], vec!["client", "conns", "Y"]]
            .iter()
            .map(|p| p.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_back_arrow_is_refused() {
    // A replica that reaches up to the handle: the old cycle's shape.
    let tree = planted(
        read_tree(),
        "replica/machine.rs",
        "use super::super::loops::handle::NodeHandle;",
    );
    let (_, problems) = check(&tree);
    let layer = layers(tree.mod_rs());
    assert_eq!(
        problems,
        [format!(
            "src/node/replica/machine.rs (`replica`, layer {}) uses `loops/handle` (layer {}): an arrow must point to a lower layer",
            layer["replica"], layer["loops/handle"]
        )]
    );
    // Through a re-export, in a group, through crate::node, between
    // siblings of a folder, and within a layer.
    for (path, line) in [
        ("command.rs", "use super::NodeHandle;"),
        (
            "status.rs",
            "use super::{client::stats::ClientView, loops::event_loop::EventLoop};",
        ),
        (
            "replica/snapshot.rs",
            "fn f() { crate::node::loops::control::Control::tick; }",
        ),
        ("client/conn.rs", "use super::conns::LoopClients;"),
        ("loops/control.rs", "use crate::node::replica::Replica;"),
    ] {
        let (_, problems) = check(&planted(read_tree(), path, line));
        assert_eq!(problems.len(), 1, "{line}: {problems:?}");
        assert!(
            problems[0].starts_with(&format!("src/node/{path}")),
            "{problems:?}"
        );
    }
}

#[test]
fn comments_and_test_modules_are_not_uses() {
    let tree = planted(
        read_tree(),
        "status.rs",
        "/// See [`NodeHandle`](super::NodeHandle). // and super::loops::handle",
    );
    assert!(check(&tree).1.is_empty());
    let mut tree = read_tree();
    let text = tree.files.get_mut("loops/waker.rs").expect("waker.rs");
    text.push_str("\n#[cfg(test)]\nmod tests {\n    use super::super::handle::NodeHandle;\n}\n");
    assert!(check(&tree).1.is_empty());
}

#[test]
fn an_unplaced_file_and_an_unknown_name_are_refused() {
    let mut tree = read_tree();
    tree.files
        .get_mut("mod.rs")
        .expect("mod.rs")
        .push_str("\nmod scratch;\n");
    let (_, problems) = check(&tree);
    assert_eq!(
        problems,
        ["src/node declares `scratch`, which no layer of the `# Layers` list in src/node/mod.rs places"]
    );
    // A file added to a noun folder is placed as that folder's.
    let mut tree = read_tree();
    tree.files
        .get_mut("client/mod.rs")
        .expect("client/mod.rs")
        .push_str("\nmod scratch;\n");
    let (_, problems) = check(&tree);
    assert_eq!(
        problems,
        ["src/node declares `client/scratch`, which no layer of the `# Layers` list in src/node/mod.rs places"]
    );
    let tree = planted(read_tree(), "loops/stall.rs", "use crate::node::os_seed;");
    let (_, problems) = check(&tree);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("uses `os_seed` of node"),
        "{problems:?}"
    );
}
