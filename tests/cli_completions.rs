//! `quire completions` and `quire man` (issue 17, item 13): both are
//! generated from the clap definition, so they name every subcommand
//! `--help` does. The completion scripts are non-empty and name the
//! subcommands (bash's parses with `bash -n`); the man pages are written,
//! one per subcommand, start with a roff header, and `man -l` renders
//! them where `man` is installed.

use std::process::{Command, Output};

fn quire(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quire"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const SUBCOMMANDS: [&str; 6] = ["up", "status", "member", "ledger", "queue", "completions"];

fn on_path(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn completion_scripts_name_the_subcommands_and_bash_parses_its_own() {
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout(&quire(&["completions", shell]));
        assert!(script.len() > 1000, "{shell}: {} bytes", script.len());
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{shell} script never names {sub}");
        }
        assert!(script.contains("admin-token-file"), "{shell}: options too");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("quire.bash");
    std::fs::write(&file, stdout(&quire(&["completions", "bash"]))).unwrap();
    let check = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(
        check.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    // An unknown shell is a usage error (2), naming the choices.
    let out = quire(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bash"));
}

#[test]
fn man_pages_are_written_one_per_subcommand_with_a_roff_header() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("man1");
    let listed = stdout(&quire(&["man", out_dir.to_str().unwrap()]));
    let mut pages = vec!["quire.1".to_string()];
    pages.extend(SUBCOMMANDS.iter().map(|s| format!("quire-{s}.1")));
    pages.extend(["quire-tune-check.1", "quire-ledger-create.1"].map(String::from));
    for page in &pages {
        let path = out_dir.join(page);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; written: {listed}", path.display()));
        // The roff header: `.TH`, after at most clap_mangen's `\(aq`
        // string definition (`.ie \n(.g ...` / `.el ...`).
        let first = text
            .lines()
            .find(|l| !l.starts_with(".ie ") && !l.starts_with(".el "))
            .unwrap_or("");
        assert!(
            first.starts_with(&format!(".TH {} 1", page.trim_end_matches(".1"))),
            "{page} starts with {first:?}"
        );
        assert!(
            listed.contains(page.as_str()),
            "{page} not listed: {listed}"
        );
    }
    let member = std::fs::read_to_string(out_dir.join("quire-member.1")).unwrap();
    assert!(member.contains("force"), "the page documents --force");

    if !on_path("man") {
        println!("skipped `man -l`: man is not installed on this host");
        return;
    }
    let rendered = Command::new("man")
        .arg("-l")
        .arg(out_dir.join("quire-member.1"))
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .env("MANWIDTH", "80")
        .output()
        .unwrap();
    assert!(
        rendered.status.success(),
        "man -l: {}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let text = String::from_utf8_lossy(&rendered.stdout);
    assert!(text.contains("quire-member"), "{text}");
}
