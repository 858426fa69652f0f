//! The operator's first hour (issue 17), on the built binaries and real
//! daemons: what `quire up`, `quire status` and the other commands print,
//! and their exit codes.
//!
//! - `quire up` with a relative `--dir` brings every link of every node up
//!   on both channels (the configs' paths resolve);
//! - `quire up` deletes only a directory it made (or with `--force`);
//! - the commands `quire up` prints work when pasted into a shell;
//! - `quire status`: `--json`, the detector's peer labels, exit code 1 on
//!   an alarm (a cut cable, a full disk) or a node that does not answer
//!   ("timed out").
//!
//! Issue 17's items and their tests (here unless named):
//!
//! | item | test |
//! | --- | --- |
//! | 1 relative `--dir` | `quire_up_with_a_relative_dir_brings_every_link_up_on_both_channels` |
//! | 2 `--dir` deletion | `quire_up_deletes_only_a_directory_it_made_unless_forced` |
//! | 3 `try:` lines, admin addresses | `the_commands_quire_up_prints_work_as_printed` (also the README transcript) |
//! | 4 reads | `quire_read_sees_the_last_append_and_stale_reads_a_follower`, `quire_tail_stale_follows_a_follower_alone`; `tests/reads.rs` (200 pairs) |
//! | 5 `quire status` | `quire_status_prints_json_the_detectors_labels_and_exits_1_on_an_alarm_or_a_dead_node`, `quire_status_raises_an_alarm_for_a_full_disk`; `tests/hardening_input.rs` (no leader) |
//! | 6 every binary | `every_binary_prints_its_version`, `a_closed_stdout_ends_each_binary_quietly_not_with_a_panic`, `errors_read_once_and_quire_status_into_a_closed_pipe_ends_quietly`, `usage_and_config_errors_exit_2_with_one_line` |
//! | 7 human output, `--json` | `human_output_has_no_debug_formatting_dates_are_rfc3339_and_absent_values_dashes`, `append_read_tail_and_member_print_json_objects` |
//! | 8 errors name the limit | `bad_arguments_are_refused_naming_the_argument_and_its_limit` |
//! | 9 stdin | `append_and_produce_read_one_record_per_line_of_stdin_given_a_dash` |
//! | 10 `quire member` | `tests/member_promote.rs` |
//! | 11 `quire tune` | `tune_disk_refuses_a_missing_directory_and_tune_apply_names_both_modes` |
//! | 12 `quire-bench` | `a_bench_job_that_could_not_run_exits_1_and_says_error_in_its_json`; `tests/bench_cli.rs` `the_plots_legend_is_below_every_curve` |
//! | 13 completions, man pages | `tests/cli_completions.rs` |
//! | 14 daemon log lines | `daemon_log_lines_are_stamped_levelled_and_in_time_order` |

mod common;

use quire::node::local::processes::LocalProcesses;
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
    // No Rust debug formatting in the demo's lines.
    assert!(text.contains("(sealed at entry 2)"), "{text}");
    assert!(!text.contains("Some("), "{text}");
    let took = text
        .lines()
        .find_map(|l| l.strip_prefix("5 appends confirmed in "))
        .unwrap();
    assert!(
        took.split(' ').next().unwrap().parse::<f64>().is_ok(),
        "{took}"
    );
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
    if commands.len() < 5 {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!("quire up printed no commands:\n{text}\n{}", stderr(&out));
    }
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
    let member = commands.iter().find(|c| c.contains(" member ")).unwrap();
    assert!(
        !member.contains("LEADER_ADMIN") && !member.contains('|'),
        "{member}"
    );
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

    // The README's transcript of its first command is what was printed:
    // each of its lines, but for the ones it abbreviates, has the shape
    // of a printed line.
    let printed: Vec<String> = printed.iter().chain(&rest).map(|l| shape(l)).collect();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let transcript: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.starts_with("quire: 3 nodes starting in "))
        .take_while(|l| !l.starts_with("```"))
        .filter(|l| *l != "..." && *l != "^C" && !l.contains(" ... "))
        .collect();
    assert!(transcript.len() > 20, "no transcript in README.md");
    for line in transcript {
        assert!(
            printed.contains(&shape(line)),
            "README.md's transcript has {line:?}, quire up printed no such line:\n{text}\n{}",
            rest.join("\n")
        );
    }
}

/// `line` with what differs from run to run made alike: white space one
/// space, a word that is a path `/P`, each number `9`, a duration `9 T`.
fn shape(line: &str) -> String {
    let words: Vec<String> = line
        .split_whitespace()
        .map(|w| {
            if w.starts_with('/') {
                return "/P".to_string();
            }
            let mut out = String::new();
            let mut in_number = false;
            for c in w.chars() {
                if c.is_ascii_digit() || (in_number && c == '.') {
                    if !in_number {
                        out.push('9');
                    }
                    in_number = true;
                } else {
                    out.push(c);
                    in_number = false;
                }
            }
            out
        })
        .collect();
    let mut shaped: Vec<&str> = Vec::new();
    for w in &words {
        match (shaped.last(), w.as_str()) {
            (Some(&"9"), "us" | "ms" | "s") => shaped.push("T"),
            _ => shaped.push(w),
        }
    }
    shaped.join(" ")
}

/// `quire ARGS --addr <every node> --token-file DIR/client.token`.
fn quire_on(procs: &LocalProcesses, args: &[&str]) -> Output {
    let addrs: Vec<String> = procs.client_addrs().iter().map(|a| a.to_string()).collect();
    Command::new(QUIRE)
        .args(args)
        .args(["--addr", &addrs.join(","), "--token-file"])
        .arg(procs.dir.join("client.token"))
        .output()
        .expect("quire runs")
}

/// The last column of every link row: the peer's classification.
fn peer_labels(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() >= 3 && (w[1] == "udp" || w[1] == "serial")
        })
        .map(|l| l.split_whitespace().last().unwrap().to_string())
        .collect()
}

const SERVE_BOUND: Duration = Duration::from_secs(20);

#[test]
fn quire_status_prints_json_the_detectors_labels_and_exits_1_on_an_alarm_or_a_dead_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = common::three_daemons(dir.path());
    // Healthy: exit 0, every peer classified up, no ALARM.
    let healthy = common::wait_for("a healthy status, exit 0", SERVE_BOUND, || {
        let o = quire_on(&procs, &["status"]);
        o.status.success().then(|| stdout(&o))
    })
    .0;
    assert!(!healthy.contains("ALARM"), "{healthy}");
    assert!(healthy.contains("peer status"), "{healthy}");
    let labels = peer_labels(&healthy);
    assert_eq!(labels.len(), 12, "{healthy}");
    assert!(labels.iter().all(|l| l == "up"), "{healthy}");

    // --json: one array, each element the node's /status plus its addr.
    let o = quire_on(&procs, &["status", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON value");
    let nodes = v.as_array().expect("an array of nodes");
    assert_eq!(nodes.len(), 3);
    for (n, addr) in nodes.iter().zip(procs.client_addrs()) {
        assert_eq!(n["addr"], addr.to_string());
        assert!(n["node"].as_u64().is_some(), "{n}");
        assert_eq!(n["alarms"], serde_json::json!([]), "{n}");
        assert_eq!(n["links"].as_array().unwrap().len(), 4, "{n}");
        assert_eq!(n["groups"][0]["group"], 0, "{n}");
        assert!(n["peers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["status"] == "up"));
    }

    // A cut serial cable: its ends classify each other serial-down, raise
    // the alarm, and status exits 1 naming the count.
    procs.cable(1, 2).unwrap().unplug();
    // (Only node 1 has a row "2 serial": node 3's cable to 2 is plugged.)
    let serial_down = |text: &str, peer: &str| {
        text.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() > 3 && w[..2] == [peer, "serial"] && w.last() == Some(&"serial-down")
        })
    };
    let (cut, code) = common::wait_for("both ends serial-down", SERVE_BOUND, || {
        let o = quire_on(&procs, &["status"]);
        let text = stdout(&o);
        (serial_down(&text, "1") && serial_down(&text, "2")).then(|| (text, o.status.code()))
    })
    .0;
    assert_eq!(code, Some(1), "{cut}");
    assert!(cut.contains("ALARM: a link is down"), "{cut}");
    procs.cable(1, 2).unwrap().replug();

    // A stopped node reads "timed out", not an OS error number.
    let third = procs.client_addrs()[2];
    procs.signal(3, libc::SIGSTOP);
    let o = quire_on(&procs, &["status"]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("node at {third}: unreachable (timed out)")),
        "{text}"
    );
    assert!(!text.contains("os error"), "{text}");
    let err = stderr(&o);
    assert!(err.contains("1 of 3 nodes unreachable"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let o = quire_on(&procs, &["status", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v[2]["addr"], third.to_string());
    assert_eq!(v[2]["error"], "timed out");

    // A node that is gone: connection refused, still exit 1.
    procs.signal(3, libc::SIGKILL);
    procs.wait(3);
    let o = quire_on(&procs, &["status"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o).contains(&format!(
            "node at {third}: unreachable (connection refused)"
        )),
        "{}",
        stdout(&o)
    );
}

/// Item 5, a disk: `quire status` raises `ALARM: group 0 disk full` for
/// the node whose log's filesystem is full and exits 1 while it is; with
/// space again the alarm goes and it exits 0. Needs root (the log on a
/// loop-mounted ext4) and says so when it skips.
#[test]
fn quire_status_raises_an_alarm_for_a_full_disk() {
    let fs = match common::LoopFs::new(64) {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("skipping the disk-full alarm: {why}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    // Node 3 logs on the small filesystem, in 1 MiB segments.
    let procs = common::three_daemons_tuned(dir.path(), |config| {
        if !config.parent().is_some_and(|d| d.ends_with("node3")) {
            return;
        }
        let text = std::fs::read_to_string(config).unwrap();
        let log = fs.path().join("log0");
        let text = text
            .replace("path = \"log0\"", &format!("path = \"{}\"", log.display()))
            .replace(
                "segment_bytes = 8388608",
                "segment_bytes = 1048576\nflush_bytes_max = 262144",
            );
        std::fs::write(config, text).unwrap();
    });
    common::wait_for("a healthy status, exit 0", SERVE_BOUND, || {
        quire_on(&procs, &["status"]).status.success().then_some(())
    });
    let ballast = fs.path().join("ballast");
    common::fill_up(&ballast);
    // Large appends (committed by nodes 1 and 2) use up node 3's segment.
    let id = quire::client::random_client_id().unwrap();
    let mut c = quire::client::Client::new(procs.client_addrs(), &procs.token, id);
    let record = vec![b'x'; 60 << 10];
    let (full, code) = common::wait_for("node 3's disk-full alarm", SERVE_BOUND, || {
        let _ = c.append(0, &record);
        let o = quire_on(&procs, &["status"]);
        let text = stdout(&o);
        text.contains("ALARM: group 0 disk full")
            .then(|| (text, o.status.code()))
    })
    .0;
    assert_eq!(code, Some(1), "{full}");
    assert_eq!(full.matches("ALARM: ").count(), 1, "{full}");
    let o = quire_on(&procs, &["status", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v[2]["alarms"], serde_json::json!(["group 0 disk full"]));
    std::fs::remove_file(&ballast).unwrap();
    let healthy = common::wait_for("the alarm to go", SERVE_BOUND, || {
        let o = quire_on(&procs, &["status"]);
        o.status.success().then(|| stdout(&o))
    })
    .0;
    assert!(!healthy.contains("ALARM"), "{healthy}");
}

#[test]
fn every_binary_prints_its_version() {
    for (name, exe) in [
        ("quire", QUIRE),
        ("quired", env!("CARGO_BIN_EXE_quired")),
        ("quire-sim", env!("CARGO_BIN_EXE_quire-sim")),
        ("quire-bench", env!("CARGO_BIN_EXE_quire-bench")),
    ] {
        let out = Command::new(exe).arg("--version").output().unwrap();
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        assert_eq!(
            stdout(&out),
            format!("{name} {}\n", env!("CARGO_PKG_VERSION")),
            "{name}"
        );
    }
}

/// Runs `exe args` with its stdout a pipe whose reading end is already
/// closed (as `| head` leaves it once head has exited).
fn with_closed_stdout(exe: &str, args: &[&str]) -> Output {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills two descriptors, each owned once below.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fds[0] is the reading end, ours alone; dropped at once.
    drop(unsafe { OwnedFd::from_raw_fd(fds[0]) });
    // SAFETY: fds[1] is the writing end, ours alone, handed to the child.
    let write_end = unsafe { OwnedFd::from_raw_fd(fds[1]) };
    Command::new(exe)
        .args(args)
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn a_closed_stdout_ends_each_binary_quietly_not_with_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    let fake_root = tempfile::tempdir().unwrap();
    let root = fake_root.path().to_str().unwrap();
    for (exe, args) in [
        (QUIRE, vec!["tune", "check", "--root", root]),
        (QUIRE, vec!["--help"]),
        (
            env!("CARGO_BIN_EXE_quire-sim"),
            vec!["--seeds", "1", "--verbose"],
        ),
        (env!("CARGO_BIN_EXE_quire-bench"), vec!["--help"]),
    ] {
        let out = with_closed_stdout(exe, &args);
        let err = stderr(&out);
        assert!(!err.contains("panicked"), "{exe} {args:?}: {err}");
        assert_ne!(out.status.code(), Some(101), "{exe} {args:?}: {err}");
        // Ended by SIGPIPE, as `cat` is, or by clap's own quiet exit.
        assert!(
            out.status.signal() == Some(libc::SIGPIPE) || out.status.code() == Some(0),
            "{exe} {args:?}: {:?} {err}",
            out.status
        );
    }
}

#[test]
fn usage_and_config_errors_exit_2_with_one_line() {
    let out = Command::new(QUIRE)
        .args(["up", "--nodes", "9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("1..=7"), "{}", stderr(&out));
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("node.toml");
    std::fs::write(&cfg, "[node]\nid = 0\n").unwrap();
    let out = Command::new(QUIRE)
        .args(["tune", "check", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("quire: ") && err.contains("node.toml"),
        "{err}"
    );
}

#[test]
fn errors_read_once_and_quire_status_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let procs = common::three_daemons(dir.path());
    let created = common::wait_for("a ledger created", SERVE_BOUND, || {
        let o = quire_on(&procs, &["ledger", "create", "--json"]);
        o.status.success().then(|| stdout(&o))
    })
    .0;
    let v: serde_json::Value = serde_json::from_str(&created).unwrap();
    let (ledger, token) = (v["ledger"].as_u64().unwrap(), v["token"].as_u64().unwrap());
    let wrong = (token + 1).to_string();
    let out = quire_on(
        &procs,
        &[
            "ledger",
            "close",
            "--ledger",
            &ledger.to_string(),
            "--token",
            &wrong,
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "quire: refused (conflict): not the ledger's writer (wrong token)\n"
    );

    let addrs: Vec<String> = procs.client_addrs().iter().map(|a| a.to_string()).collect();
    let token_file = procs.dir.join("client.token");
    let args = [
        "status",
        "--addr",
        &addrs.join(","),
        "--token-file",
        token_file.to_str().unwrap(),
    ];
    let out = with_closed_stdout(QUIRE, &args);
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
}

#[test]
fn bad_arguments_are_refused_naming_the_argument_and_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("client.token");
    std::fs::write(&token, "t").unwrap();
    let t = token.to_str().unwrap();
    // Nothing listens here: the CLI must refuse before it connects.
    let on = ["--addr", "127.0.0.1:9", "--token-file", t];
    let long_name = "q".repeat(300);
    let cases: Vec<(Vec<&str>, &[&str])> = vec![
        (
            vec!["queue", "create", ""],
            &["<NAME>", "1 to 255 bytes", "0 bytes"],
        ),
        (
            vec!["queue", "create", &long_name],
            &["1 to 255 bytes", "300 bytes"],
        ),
        (
            vec!["queue", "create", "q", "--max-deliveries", "0"],
            &["--max-deliveries", "1..=1000"],
        ),
        (
            vec!["queue", "consume", "q", "--visibility-ms", "0"],
            &["--visibility-ms", "1..=43200000"],
        ),
        (
            vec!["queue", "consume", "q", "--max", "5000"],
            &["--max", "1..=1024"],
        ),
        (vec!["read", "--from", "0"], &["--from", "first index is 1"]),
        (vec!["read", "--max", "5000"], &["--max", "1..=4096"]),
        (vec!["append"], &["<RECORDS>"]),
        (vec!["queue", "produce", "q"], &["<MESSAGES>"]),
        (vec!["queue", "ack", "q"], &["<IDS>"]),
    ];
    for (args, want) in cases {
        let out = Command::new(QUIRE).args(&args).args(on).output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        for w in want {
            assert!(err.contains(w), "{args:?}: want {w:?} in {err}");
        }
        assert!(!err.contains("invalid argument"), "{args:?}: {err}");
    }
}

#[test]
fn append_and_produce_read_one_record_per_line_of_stdin_given_a_dash() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let procs = common::three_daemons(dir.path());
    let addrs: Vec<String> = procs.client_addrs().iter().map(|a| a.to_string()).collect();
    let piped = |args: &[&str], input: String| {
        let mut child = Command::new(QUIRE)
            .args(args)
            .args(["--addr", &addrs.join(","), "--token-file"])
            .arg(procs.dir.join("client.token"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let feeder = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
        let out = child.wait_with_output().unwrap();
        feeder.join().unwrap().unwrap();
        out
    };
    // `seq 1000 | quire append ... -`
    let seq: String = (1..=1000).map(|i| format!("{i}\n")).collect();
    let out = piped(&["append", "-"], seq);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 1000);
    let indexes: Vec<u64> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let (index, record) = l
                .strip_prefix("appended at index ")
                .and_then(|r| r.split_once(": "))
                .unwrap_or_else(|| panic!("{l}"));
            assert_eq!(record, (i + 1).to_string());
            index.parse().unwrap()
        })
        .collect();
    assert!(indexes.windows(2).all(|w| w[0] < w[1]), "in order");
    let first = indexes[0].to_string();
    // Reads are linearizable: all 1000 are there at once.
    let read = quire_on(&procs, &["read", "--from", &first, "--max", "1000"]);
    assert!(read.status.success(), "{}", stderr(&read));
    let data: Vec<String> = stdout(&read)
        .lines()
        .map(|l| l.rsplit('\t').next().unwrap().to_string())
        .collect();
    assert_eq!(data, (1..=1000).map(|i| i.to_string()).collect::<Vec<_>>());

    // `seq 3000 | quire queue produce ... jobs -`, CRLF endings too.
    assert!(quire_on(&procs, &["queue", "create", "jobs"])
        .status
        .success());
    let seq: String = (1..=3000).map(|i| format!("job {i}\r\n")).collect();
    let out = piped(&["queue", "produce", "jobs", "-", "--json"], seq);
    assert!(out.status.success(), "{}", stderr(&out));
    let produced: u64 = stdout(&out)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["count"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert_eq!(produced, 3000);
    let got = quire_on(
        &procs,
        &["queue", "consume", "jobs", "--max", "2", "--json"],
    );
    let first: serde_json::Value =
        serde_json::from_str(stdout(&got).lines().next().unwrap()).unwrap();
    assert_eq!(first["data"], "job 1");
}

#[test]
fn tune_disk_refuses_a_missing_directory_and_tune_apply_names_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("typo");
    let out = Command::new(QUIRE)
        .args(["tune", "disk", "--seconds", "0.05"])
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("typo") && err.contains("no such directory"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!missing.exists(), "not created");
    assert_eq!(stdout(&out), "", "nothing was measured");

    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = Command::new(QUIRE)
        .args(["tune", "disk"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("not a directory"), "{}", stderr(&out));

    let out = Command::new(QUIRE)
        .args(["tune", "apply"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("--dry-run") && err.contains("--yes"), "{err}");
}

/// True if `s` is RFC 3339 to the millisecond: `2026-12-01T11:16:15.451Z`
/// or with a `+01:00` offset.
fn is_rfc3339_ms(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    let zone = &s[23.min(s.len())..];
    s.len() >= 24
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[19] == b'.'
        && digits(20..23)
        && (zone == "Z"
            || (zone.len() == 6
                && (zone.starts_with('+') || zone.starts_with('-'))
                && zone.as_bytes()[3] == b':'))
}

#[test]
fn human_output_has_no_debug_formatting_dates_are_rfc3339_and_absent_values_dashes() {
    let dir = tempfile::tempdir().unwrap();
    let procs = common::three_daemons(dir.path());
    let json = |o: &Output| -> serde_json::Value {
        serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
    };
    let created = common::wait_for("a ledger created", SERVE_BOUND, || {
        let o = quire_on(&procs, &["ledger", "create", "--json"]);
        o.status.success().then(|| json(&o))
    })
    .0;
    let (id, token) = (created["ledger"].to_string(), created["token"].to_string());
    // An empty ledger: its LAC and last entry are absent.
    let open = quire_on(&procs, &["ledger", "open", "--ledger", &id]);
    let text = stdout(&open);
    assert!(
        text.contains(": open, 0 entries, 0 bytes, LAC -, created "),
        "{text}"
    );
    let closed = quire_on(
        &procs,
        &["ledger", "close", "--ledger", &id, "--token", &token],
    );
    assert_eq!(
        stdout(&closed),
        format!("ledger {id} closed; last entry -\n")
    );
    // One with entries.
    let w = json(&quire_on(&procs, &["ledger", "create", "--json"]));
    let (id2, token2) = (w["ledger"].to_string(), w["token"].to_string());
    let ok = quire_on(
        &procs,
        &[
            "ledger", "append", "--ledger", &id2, "--token", &token2, "a", "b",
        ],
    );
    assert!(ok.status.success(), "{}", stderr(&ok));
    let closed = quire_on(
        &procs,
        &["ledger", "close", "--ledger", &id2, "--token", &token2],
    );
    assert_eq!(
        stdout(&closed),
        format!("ledger {id2} closed; last entry 1\n")
    );

    let list = stdout(&quire_on(&procs, &["ledger", "list"]));
    let rows: Vec<Vec<&str>> = list.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), 2, "{list}");
    for r in &rows {
        assert_eq!(r.len(), 6, "{list}");
        assert_eq!(r[1], "closed", "{list}");
        let date = r[5].strip_prefix("created ").unwrap();
        assert!(is_rfc3339_ms(date), "{date}");
    }
    assert_eq!(rows[0][4], "LAC -");
    assert_eq!(rows[1][4], "LAC 1");
    for text in [&list, &stdout(&open)] {
        for debug in ["Some(", "None", "Open", "Closed", " ms"] {
            assert!(!text.contains(debug), "{debug:?} in {text}");
        }
    }
}

/// Item 7, `--json` where a script wants it: `quire append`, `read` and
/// `tail` print one object per record, `quire member` one per change
/// (`status`, ledgers and queues: the tests above).
#[test]
fn append_read_tail_and_member_print_json_objects() {
    let dir = tempfile::tempdir().unwrap();
    let procs = common::three_daemons(dir.path());
    let objects = |o: &Output| -> Vec<serde_json::Value> {
        assert!(o.status.success(), "{}", stderr(o));
        stdout(o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    };
    let appended = objects(&quire_on(&procs, &["append", "--json", "a", "b"]));
    assert_eq!(appended.len(), 2);
    assert_eq!(appended[0]["data"], "a");
    assert_eq!(appended[1]["data"], "b");
    // Record addresses are ordered as the log, not dense: two requests
    // may land in two entries (docs/internals/client-protocol.md).
    let first = appended[0]["index"].as_u64().unwrap();
    assert!(
        appended[1]["index"].as_u64().unwrap() > first,
        "{appended:?}"
    );

    let from = first.to_string();
    let read = objects(&quire_on(
        &procs,
        &["read", "--json", "--from", &from, "--max", "2"],
    ));
    assert_eq!(read.len(), 2);
    for (r, a) in read.iter().zip(&appended) {
        assert_eq!((&r["index"], &r["data"]), (&a["index"], &a["data"]));
        assert!(r["term"].as_u64().unwrap() >= 1, "{r}");
    }

    let addrs: Vec<String> = procs.client_addrs().iter().map(|a| a.to_string()).collect();
    let mut tail = Command::new(QUIRE)
        .args([
            "tail",
            "--json",
            "--from",
            &from,
            "--addr",
            &addrs.join(","),
        ])
        .arg("--token-file")
        .arg(procs.dir.join("client.token"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut tailed = BufReader::new(tail.stdout.take().unwrap()).lines();
    for a in &appended {
        let line = tailed.next().expect("a line").unwrap();
        let t: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!((&t["index"], &t["data"]), (&a["index"], &a["data"]));
    }
    let _ = tail.kill();
    let _ = tail.wait();

    let leader = common::agreed_leader(&procs, SERVE_BOUND);
    let follower = *procs.nodes.keys().find(|&&n| n != leader).unwrap();
    let admin = procs.nodes[&leader].admin.to_string();
    let token = procs.dir.join("admin.token");
    let member = |change: &str| {
        Command::new(QUIRE)
            .args(["member", "--json", "--admin", &admin, "--admin-token-file"])
            .arg(&token)
            .args([change, "--node", &follower.to_string()])
            .output()
            .unwrap()
    };
    for change in ["remove", "learner"] {
        let answers = objects(&member(change));
        assert_eq!(answers.len(), 1);
        let a = &answers[0];
        assert_eq!(
            (&a["group"], &a["change"], &a["node"]),
            (&0.into(), &change.into(), &follower.into()),
            "{a}"
        );
        assert!(
            a["answer"].as_str().unwrap().contains("applied at index"),
            "{a}"
        );
    }
    // A refusal is an error, as without --json.
    let refused = member("learner");
    assert_eq!(refused.status.code(), Some(1));
    assert_eq!(stdout(&refused), "");
    assert!(
        stderr(&refused).starts_with("quire: "),
        "{}",
        stderr(&refused)
    );
}

#[test]
fn a_bench_job_that_could_not_run_exits_1_and_says_error_in_its_json() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("client.token");
    std::fs::write(&token, "no-such-cluster").unwrap();
    // Nothing listens on port 9: not one append can succeed.
    let out = Command::new(env!("CARGO_BIN_EXE_quire-bench"))
        .args([
            "--name=nocluster",
            "--ioengine=cluster",
            "--servers=127.0.0.1:9",
            "--runtime=1",
            "--output-format=json",
        ])
        .arg(format!("--token_file={}", token.display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 1, "{job}");
    let msg = job["error_message"].as_str().expect("an error_message");
    assert!(msg.starts_with("no operation succeeded; failed: "), "{msg}");
}

/// Group 0's leader, once there is one, and the client addresses of the
/// other nodes.
fn leader_and_followers(procs: &LocalProcesses) -> (u64, Vec<String>) {
    let mut c = quire::client::Client::new(procs.client_addrs(), &procs.token, 5);
    let (leader, _) = common::wait_for("a leader of group 0", SERVE_BOUND, || {
        let row = c.leaders(0).ok()?.into_iter().find(|r| r.leader != 0)?;
        Some(row.leader)
    });
    let followers = procs
        .nodes
        .iter()
        .filter(|(id, _)| **id != leader)
        .map(|(_, n)| n.client.to_string())
        .collect();
    (leader, followers)
}

/// `quire read` right after `quire append` sees the record even when the
/// first node it asks is a follower (issue 17, item 4: it missed 17 times
/// in 20); `--stale` reads that follower's applied copy, and its help
/// says what it may miss.
#[test]
fn quire_read_sees_the_last_append_and_stale_reads_a_follower() {
    let dir = tempfile::tempdir().unwrap();
    let procs = common::three_daemons(dir.path());
    let (leader, mut addrs) = leader_and_followers(&procs);
    let follower = addrs[0].clone();
    addrs.push(procs.nodes[&leader].client.to_string());
    let token = procs.dir.join("client.token");
    let run = |args: &[&str], addr: &str| {
        Command::new(QUIRE)
            .args(args)
            .args(["--addr", addr, "--token-file"])
            .arg(&token)
            .output()
            .expect("quire runs")
    };
    for k in 0..20 {
        let record = format!("fresh {k}");
        let out = run(&["append", &record], &addrs.join(","));
        assert!(out.status.success(), "{}", stderr(&out));
        let index = stdout(&out)
            .strip_prefix("appended at index ")
            .and_then(|r| r.split_once(':'))
            .map(|(i, _)| i.to_string())
            .expect("an index");
        let read = run(&["read", "--from", &index, "--max", "1"], &addrs.join(","));
        assert!(read.status.success(), "{}", stderr(&read));
        assert_eq!(
            stdout(&read)
                .lines()
                .next()
                .and_then(|l| l.rsplit('\t').next()),
            Some(record.as_str()),
            "read {k} after the append at {index}"
        );
    }
    // --stale on the follower alone: served there (it may lag, so retried).
    common::wait_for("the follower's stale copy", SERVE_BOUND, || {
        let read = run(&["read", "--stale", "--max", "4096"], &follower);
        assert!(read.status.success(), "{}", stderr(&read));
        stdout(&read).contains("fresh 19").then_some(())
    });
    let help = Command::new(QUIRE)
        .args(["read", "--help"])
        .output()
        .unwrap();
    assert!(
        stdout(&help).contains("committed but not yet"),
        "{}",
        stdout(&help)
    );
}

/// `quire tail --stale` given a follower's address alone follows that
/// follower's copy (a linearizable tail there would only be told
/// NotLeader): records appended through the leader, before it started and
/// while it runs, are printed in log order, none twice; its help says what
/// a stale tail misses.
#[test]
fn quire_tail_stale_follows_a_follower_alone() {
    use std::sync::mpsc;
    let dir = tempfile::tempdir().unwrap();
    let procs = common::three_daemons(dir.path());
    let (_, followers) = leader_and_followers(&procs);
    let append = |record: &str| {
        let out = quire_on(&procs, &["append", record]);
        assert!(out.status.success(), "{}", stderr(&out));
    };
    append("before 0");
    append("before 1");
    let mut tail = Command::new(QUIRE)
        .args(["tail", "--stale", "--from", "1", "--addr", &followers[0]])
        .arg("--token-file")
        .arg(procs.dir.join("client.token"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = mpsc::channel();
    let tail_out = tail.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(tail_out).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    append("after 0");
    append("after 1");
    let started = std::time::Instant::now();
    let mut printed: Vec<String> = Vec::new();
    while !printed.iter().any(|l| l.ends_with("\tafter 1")) {
        let left = SERVE_BOUND.saturating_sub(started.elapsed());
        match lines.recv_timeout(left) {
            Ok(line) => printed.push(line),
            Err(_) => {
                let _ = tail.kill();
                let out = tail.wait_with_output().unwrap();
                panic!(
                    "quire tail --stale printed only {printed:?}: {}",
                    stderr(&out)
                );
            }
        }
    }
    let _ = tail.kill();
    let _ = tail.wait();
    reader.join().unwrap();
    let rows: Vec<(u64, &str)> = printed
        .iter()
        .map(|l| {
            let mut cols = l.splitn(3, '\t');
            let index = cols.next().and_then(|i| i.parse().ok());
            let data = cols.nth(1);
            index.zip(data).unwrap_or_else(|| panic!("{l:?}"))
        })
        .collect();
    assert!(
        rows.windows(2).all(|w| w[0].0 < w[1].0),
        "in log order, none twice: {printed:?}"
    );
    let records: Vec<&str> = rows.iter().map(|r| r.1).filter(|d| !d.is_empty()).collect();
    assert_eq!(
        records,
        ["before 0", "before 1", "after 0", "after 1"],
        "{printed:?}"
    );
    let help = Command::new(QUIRE)
        .args(["tail", "--help"])
        .output()
        .unwrap();
    let help = stdout(&help);
    assert!(
        help.contains("--stale") && help.contains("committed but not yet applied"),
        "{help}"
    );
}

/// Item 14: every line a running daemon logs starts with an RFC 3339 UTC
/// stamp and a level, and the stamps never go back (before, lines carried
/// the loop's uptime of the event, `at 201337 ms`, which could print
/// before `at 201237 ms`).
#[test]
fn daemon_log_lines_are_stamped_levelled_and_in_time_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = common::three_daemons(dir.path());
    let out = quire_on(&procs, &["append", "logged"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // A transition to log: one node stops, the others see it go down.
    procs.signal(3, libc::SIGKILL);
    let log1 = dir.path().join("node1/quired.log");
    common::wait_for("node 1 to log node 3 down", SERVE_BOUND, || {
        let text = std::fs::read_to_string(&log1).ok()?;
        text.lines()
            .any(|l| l.contains("node 3: ") && l.contains("-> down"))
            .then_some(())
    });
    for (id, code) in procs.stop_all() {
        assert!(id == 3 || code == Some(0), "node {id} exit {code:?}");
    }
    for id in 1..=2 {
        let text =
            std::fs::read_to_string(dir.path().join(format!("node{id}/quired.log"))).unwrap();
        let mut last = String::new();
        let mut lines = 0;
        for line in text.lines() {
            let (stamp, rest) = line.split_once(' ').unwrap_or((line, ""));
            assert!(
                is_rfc3339_ms(stamp) && stamp.ends_with('Z'),
                "node {id}: {line}"
            );
            let level = rest.split_whitespace().next().unwrap_or("");
            assert!(
                ["INFO", "WARN", "ERROR"].contains(&level),
                "node {id}: {line}"
            );
            assert!(stamp >= last.as_str(), "node {id}: {stamp} after {last}");
            assert!(
                !rest.contains(" at ") || !rest.contains(" ms: "),
                "node {id}: {line}"
            );
            last = stamp.to_string();
            lines += 1;
        }
        assert!(lines >= 3, "node {id}: {text}");
        assert!(
            text.contains("WARN  node"),
            "node {id} logged no warning: {text}"
        );
    }
}
