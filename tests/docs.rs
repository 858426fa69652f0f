//! Documentation is part of the feature: these tests hold the documents to
//! the code.
//!
//! - every metric the admin endpoint exports has a row in
//!   `docs/operating/metrics.md`;
//! - every key the config file parser accepts has a row in
//!   `docs/operating/config.md` (the keys come from the parser itself,
//!   through its refusal of an unknown key, so a new key or section cannot
//!   be forgotten here either);
//! - every relative link in the project's markdown points to a file that
//!   exists, and a `#anchor` into a markdown file to one of its headings.
//!
//! Each check is a function over text, so a test below shows it failing on
//! a document that lacks what it wants.

mod common;

use quire::node::daemon::config_file::load_with_cores;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The names in `wanted` that have no table row `` | `name` | `` in `doc`.
fn missing_rows<'a>(doc: &str, wanted: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    wanted
        .into_iter()
        .filter(|name| !doc.contains(&format!("| `{name}` |")))
        .collect()
}

#[test]
fn every_exported_metric_is_documented() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::single_node(dir.path());
    let text = quire::node::admin::metrics::metrics_text(&node.status().unwrap());
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(names.len() >= 40, "{text}");
    let missing = missing_rows(&read("docs/operating/metrics.md"), names);
    assert!(
        missing.is_empty(),
        "docs/operating/metrics.md has no row for {missing:?}"
    );
}

// ---------------------------------------------------------------------
// Config keys

/// The smallest valid config file, with a top-level table for each
/// section that `probe` adds a key to.
const MINIMAL: &str = r#"
[node]
id = 1
cluster_key_file = "cluster.key"
auth_token_file = "client.token"

[[peers]]
id = 2
udp = "10.0.0.2:7400"

[[disks]]
path = "log0"
group = 0
"#;

/// Loads config `text` from a directory holding a key and a token file,
/// and returns the keys the parser lists when it refuses `bogus`, the
/// unknown key the text holds.
fn keys_listed(text: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("cluster.key"),
        "0123456789abcdef0123456789abcdef",
    )
    .unwrap();
    std::fs::write(dir.path().join("client.token"), "s3cret-token").unwrap();
    let path = dir.path().join("node.toml");
    std::fs::write(&path, text).unwrap();
    let e = load_with_cores(&path, &[0]).expect_err("bogus must be refused");
    let msg = e.to_string();
    let list = msg
        .split("the keys here are: ")
        .nth(1)
        .unwrap_or_else(|| panic!("no key list in: {msg}"));
    list.trim().split(", ").map(str::to_string).collect()
}

/// Every key of the config file, as `section.key` (`peers[].id`), from
/// the parser's own lists.
fn config_keys() -> Vec<String> {
    let sections = keys_listed(&format!("bogus = 1\n{MINIMAL}"));
    assert!(sections.len() >= 10, "{sections:?}");
    let mut keys = Vec::new();
    for section in &sections {
        // A key in the section's table: the array tables and `[node]`
        // exist in MINIMAL, the others are added.
        let probe = match section.as_str() {
            "node" => MINIMAL.replacen("[node]\n", "[node]\nbogus = 1\n", 1),
            "peers" => MINIMAL.replacen("[[peers]]\n", "[[peers]]\nbogus = 1\n", 1),
            "disks" => MINIMAL.replacen("[[disks]]\n", "[[disks]]\nbogus = 1\n", 1),
            s => format!("{MINIMAL}\n[{s}]\nbogus = 1\n"),
        };
        let prefix = match section.as_str() {
            "peers" | "disks" => format!("{section}[]"),
            s => s.to_string(),
        };
        for key in keys_listed(&probe) {
            keys.push(format!("{prefix}.{key}"));
        }
    }
    keys
}

#[test]
fn every_config_key_is_documented() {
    let keys = config_keys();
    assert!(keys.len() > 60, "{keys:?}");
    for k in [
        "node.id",
        "peers[].udp",
        "disks[].group",
        "snapshot.interval_ms",
    ] {
        assert!(keys.iter().any(|x| x == k), "{k} not found in {keys:?}");
    }
    let missing = missing_rows(
        &read("docs/operating/config.md"),
        keys.iter().map(String::as_str),
    );
    assert!(
        missing.is_empty(),
        "docs/operating/config.md has no row for {missing:?}"
    );
}

#[test]
fn a_missing_row_is_reported() {
    let doc = "| key | meaning |\n| --- | --- |\n| `node.id` | this node |\n";
    assert_eq!(missing_rows(doc, ["node.id", "node.cores"]), ["node.cores"]);
    // A mention in prose is not a row.
    let doc = "`node.cores` is a list; | `node.id` | x |";
    assert_eq!(missing_rows(doc, ["node.cores"]), ["node.cores"]);
}

// ---------------------------------------------------------------------
// Links

/// The markdown files whose links are checked.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![
        root().join("README.md"),
        root().join("HARDWARE.md"),
        root().join("bench/README.md"),
    ];
    for dir in ["docs", "tuning"] {
        let mut stack = vec![root().join(dir)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
                let p = e.unwrap().path();
                if p.is_dir() {
                    // tuning/ has no subdirectories of documents.
                    if dir == "docs" {
                        stack.push(p);
                    }
                } else if p.extension().is_some_and(|x| x == "md") {
                    files.push(p);
                }
            }
        }
    }
    files.sort();
    files
}

/// Text outside fenced code blocks, with inline code spans blanked, so
/// that `a[i](x)` in code is not taken for a link.
fn prose(md: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if fenced {
            out.push('\n');
            continue;
        }
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
                out.push(' ');
            } else {
                out.push(if in_code { ' ' } else { c });
            }
        }
        out.push('\n');
    }
    out
}

/// The targets of the inline links `[text](target)` in `md`.
fn link_targets(md: &str) -> Vec<String> {
    let text = prose(md);
    let mut targets = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            targets.push(rest[..end].trim().to_string());
            rest = &rest[end..];
        }
    }
    targets
}

/// A heading's anchor as GitHub makes it: lower case, spaces to hyphens,
/// punctuation other than `-` and `_` dropped.
fn slug(heading: &str) -> String {
    let mut s = String::new();
    for c in heading.trim().chars() {
        if c == ' ' {
            s.push('-');
        } else if c.is_alphanumeric() || c == '-' || c == '_' {
            s.extend(c.to_lowercase());
        }
    }
    s
}

/// The anchors of `md`'s headings (a repeated heading gets `-1`, `-2`...).
fn anchors(md: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let base = slug(title);
        let mut a = base.clone();
        let mut n = 0;
        while seen.contains(&a) {
            n += 1;
            a = format!("{base}-{n}");
        }
        seen.insert(a);
    }
    seen
}

/// What is wrong with the relative links of the markdown file `file`
/// (text `md`): each entry names the target and why.
fn broken_links(file: &Path, md: &str) -> Vec<String> {
    let mut broken = Vec::new();
    for target in link_targets(md) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let dest = if path.is_empty() {
            file.to_path_buf()
        } else {
            file.parent().unwrap().join(path)
        };
        if !dest.exists() {
            broken.push(format!("{target}: no such file"));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if dest.extension().is_some_and(|x| x == "md") {
            let text = if path.is_empty() {
                md.to_string()
            } else {
                std::fs::read_to_string(&dest).unwrap()
            };
            if !anchors(&text).contains(anchor) {
                broken.push(format!("{target}: no heading with anchor #{anchor}"));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_resolves() {
    let files = markdown_files();
    assert!(files.len() >= 15, "{files:?}");
    let mut broken = Vec::new();
    let mut links = 0;
    for f in &files {
        let md = std::fs::read_to_string(f).unwrap();
        links += link_targets(&md).len();
        for b in broken_links(f, &md) {
            broken.push(format!(
                "{}: {b}",
                f.strip_prefix(root()).unwrap().display()
            ));
        }
    }
    assert!(links > 100, "{links} links");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn a_broken_link_is_reported() {
    let file = root().join("docs/README.md");
    let md = "# Title\n\n[ok](operating/cli.md#exit-codes) [self](#title) \
              [gone](operating/nope.md) [bad anchor](operating/cli.md#no-such-heading) \
              `[in code](nope.md)`\n\n```\n[fenced](nope.md)\n```\n";
    assert_eq!(
        broken_links(&file, md),
        [
            "operating/nope.md: no such file",
            "operating/cli.md#no-such-heading: no heading with anchor #no-such-heading",
        ]
    );
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    let a = anchors(
        "# quire, quired and the client library\n## Set-up on a fresh machine\n\
         ## Changes: POST /membership\n## `quire up`\n## Notes\n## Notes\n",
    );
    for want in [
        "quire-quired-and-the-client-library",
        "set-up-on-a-fresh-machine",
        "changes-post-membership",
        "quire-up",
        "notes",
        "notes-1",
    ] {
        assert!(a.contains(want), "{want} not in {a:?}");
    }
}
