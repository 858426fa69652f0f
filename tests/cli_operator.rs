//! The operator's first hour (issue 17), on the built binaries and real
//! daemons: what `quire up`, `quire status` and the other commands print,
//! and their exit codes.
//!
//! - `quire up` with a relative `--dir` brings every link of every node up
//!   on both channels (the configs' paths resolve);
//! - `quire up` deletes only a directory it made (or with `--force`);
//! - the commands `quire up` prints work when pasted into a shell.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const QUIRE: &str = env!("CARGO_BIN_EXE_quire");

/// `quire up --demo-only ARGS` run in `cwd`.
fn up_demo(cwd: &Path, args: &[&str]) -> Output {
    Command::new(QUIRE)
        .args(["up", "--demo-only"])
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("quire up runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The link rows of a printed status: (peer, channel, state) per line.
fn link_rows(text: &str) -> Vec<(String, String, String)> {
    text.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() >= 3 && (w[1] == "udp" || w[1] == "serial") && w[0].parse::<u64>().is_ok())
                .then(|| (w[0].to_string(), w[1].to_string(), w[2].to_string()))
        })
        .collect()
}

#[test]
fn quire_up_with_a_relative_dir_brings_every_link_up_on_both_channels() {
    let cwd = tempfile::tempdir().unwrap();
    let out = up_demo(cwd.path(), &["--dir", "rel/quire-up"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(!text.contains("ALARM"), "{text}");
    let rows = link_rows(&text);
    // 3 nodes × 2 peers × 2 channels.
    assert_eq!(rows.len(), 12, "{text}");
    for (peer, channel, state) in &rows {
        assert_eq!(state, "up", "peer {peer} {channel}:\n{text}");
    }
    assert_eq!(rows.iter().filter(|r| r.1 == "serial").count(), 6);
    // Every path in a config is absolute or relative to the config itself.
    let cfg = std::fs::read_to_string(cwd.path().join("rel/quire-up/node1/node.toml")).unwrap();
    for line in cfg.lines().filter(|l| l.starts_with("serial")) {
        let path = line.split('"').nth(1).unwrap();
        assert!(Path::new(path).is_absolute(), "{line}");
        assert!(path.ends_with("ttyA") || path.ends_with("ttyB"), "{line}");
    }
}

#[test]
fn quire_up_deletes_only_a_directory_it_made_unless_forced() {
    let cwd = tempfile::tempdir().unwrap();
    // A directory of the user's own is refused, untouched, naming --force.
    let mine = cwd.path().join("precious");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("thesis.txt"), "years of work").unwrap();
    let out = up_demo(cwd.path(), &["--dir", "precious"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("--force"), "{err}");
    assert!(err.contains("precious"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(
        std::fs::read_to_string(mine.join("thesis.txt")).unwrap(),
        "years of work"
    );
    assert!(!mine.join("node1").exists(), "nothing was written into it");

    // A directory quire up made is reused: the second run clears it.
    for run in 0..2 {
        let out = up_demo(cwd.path(), &["--dir", "made"]);
        assert!(out.status.success(), "run {run}: {}", stderr(&out));
        assert!(cwd.path().join("made/.quire-up").is_file());
    }

    // --force deletes the user's directory.
    let out = up_demo(cwd.path(), &["--dir", "precious", "--force"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!mine.join("thesis.txt").exists());
}

#[test]
fn the_commands_quire_up_prints_work_as_printed() {
    let cwd = tempfile::tempdir().unwrap();
    let mut child = Command::new(QUIRE)
        .args(["up", "--dir", "quire-up"])
        .current_dir(cwd.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let done = line.starts_with("Ctrl-C");
        printed.push(line);
        if done {
            break;
        }
    }
    let text = printed.join("\n");
    let commands: Vec<&str> = printed
        .iter()
        .filter_map(|l| l.strip_prefix("try: ").or_else(|| l.strip_prefix("     ")))
        .collect();
    assert!(commands.len() >= 5, "{text}");
    assert!(
        commands[0].starts_with(QUIRE),
        "the binary's own path:\n{text}"
    );
    // Each node's admin address, and it answers.
    for id in 1..=3 {
        assert!(
            text.contains(&format!("node {id}: client 127.0.0.1:")),
            "{text}"
        );
    }
    let admin = printed
        .iter()
        .find_map(|l| l.split("admin http://").nth(1))
        .expect("an admin address");
    let addr: std::net::SocketAddr = admin.trim().parse().unwrap();
    assert!(std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok());

    // Pasted into a shell from another directory, each command works.
    let elsewhere = tempfile::tempdir().unwrap();
    let sh = |cmd: &str| {
        Command::new("sh")
            .args(["-c", cmd])
            .current_dir(elsewhere.path())
            .output()
            .unwrap()
    };
    let status = sh(commands[0]);
    assert!(
        status.status.success(),
        "{}{}",
        stdout(&status),
        stderr(&status)
    );
    assert_eq!(
        stdout(&status).matches("node ").count(),
        3,
        "{}",
        stdout(&status)
    );
    let append = commands.iter().find(|c| c.contains(" append ")).unwrap();
    let out = sh(append);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("my record"), "{}", stdout(&out));
    for verb in [" queue create ", " queue produce ", " ledger list "] {
        let cmd = commands.iter().find(|c| c.contains(verb)).unwrap();
        let out = sh(cmd);
        assert!(out.status.success(), "{cmd}: {}", stderr(&out));
    }

    // Ctrl-C stops it cleanly.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(child.wait().unwrap().success(), "{}", rest.join("\n"));
    assert!(
        rest.iter()
            .any(|l| l.contains("node 1 exit 0, node 2 exit 0, node 3 exit 0")),
        "{rest:?}"
    );
}
