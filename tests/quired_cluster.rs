//! End to end on real processes: three `quired` daemons on 127.0.0.1 with
//! random free ports, temp dirs and PTY null-modem cables, driven through
//! the client library (`quire::client`) over the client protocol.
//!
//! - appends are confirmed, and after all three nodes restart they read
//!   back identical from every node's log;
//! - a SIGKILL of the leader while appends run loses no confirmed append,
//!   and the client's retries are applied once;
//! - a bad config file exits with code 2 and one message naming the key;
//! - `quire up --demo-only` starts a cluster, writes, reads back from every
//!   node and stops it cleanly;
//! - a SIGHUP is logged by a daemon, which serves on; one to `quire up`
//!   (its terminal closing) stops every node cleanly.

mod common;

use quire::client::Client;
use quire::node::local::processes::LocalProcesses;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::Command;
use std::time::{Duration, Instant};

fn cluster(dir: &std::path::Path) -> LocalProcesses {
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_quired"));
    let mut c = LocalProcesses::prepare(dir, 3, 1, &exe).expect("cluster prepared");
    c.start_all().expect("daemons start");
    c
}

/// A client of `procs` that waits up to 20 s for each call.
fn client(procs: &LocalProcesses, id: u64) -> Client {
    let mut c = Client::new(procs.client_addrs(), &procs.token, id);
    c.deadline = Duration::from_secs(20);
    c
}

/// Node `i`'s whole copy of group 0's committed log, read page by page
/// (a Read answers at most 4096 entries).
fn read_all(c: &mut Client, i: usize) -> Option<Vec<quire::client::Entry>> {
    let mut out = Vec::new();
    let mut from = 1;
    loop {
        let page = c.read_from(i, 0, from, 4096).ok()?;
        let Some(last) = page.last() else {
            return Some(out);
        };
        from = last.index + 1;
        out.extend(page);
    }
}

/// Every node's copy of group 0 from index 1, once each has `n` records.
fn copies(c: &mut Client, nodes: usize, n: usize) -> Vec<Vec<(u64, Vec<u8>)>> {
    (0..nodes)
        .map(|i| {
            common::wait_for(
                "every node to apply everything",
                Duration::from_secs(20),
                || {
                    let got = read_all(c, i)?;
                    (got.len() >= n).then(|| {
                        got.into_iter()
                            .map(|e| (e.index, e.data.to_vec()))
                            .collect()
                    })
                },
            )
            .0
        })
        .collect()
}

/// Runs `quired --config CFG` to completion (a config it refuses).
fn quired_with_config(cfg: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_quired"))
        .arg("--config")
        .arg(cfg)
        .output()
        .unwrap()
}

#[test]
fn appends_survive_a_restart_of_every_node_identical_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = cluster(dir.path());
    let mut c = client(&procs, 7);
    for i in 0..50 {
        c.append(0, format!("record {i}").as_bytes())
            .expect("confirmed");
    }
    for (id, code) in procs.stop_all() {
        assert_eq!(code, Some(0), "node {id} stops cleanly on SIGTERM");
    }
    procs.start_all().unwrap();
    let mut c = client(&procs, 8);
    let all = copies(&mut c, 3, 50);
    assert!(
        all.windows(2).all(|w| w[0] == w[1]),
        "identical on every node"
    );
    let data: Vec<String> = all[0]
        .iter()
        .map(|(_, d)| String::from_utf8_lossy(d).into_owned())
        .collect();
    let want: Vec<String> = (0..50).map(|i| format!("record {i}")).collect();
    assert_eq!(data, want);
}

#[test]
fn sigkill_of_the_leader_loses_no_confirmed_append_and_applies_retries_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = cluster(dir.path());
    let mut c = client(&procs, 9);
    c.append(0, b"warm-up").expect("a leader");
    let leader = common::wait_for("a leader", Duration::from_secs(10), || {
        c.leaders(0)
            .ok()?
            .first()
            .map(|l| l.leader)
            .filter(|&l| l != 0)
    })
    .0;
    let mut confirmed = Vec::new();
    let started = Instant::now();
    let mut killed = false;
    let mut i = 0;
    while started.elapsed() < Duration::from_secs(10) {
        if !killed && started.elapsed() > Duration::from_secs(1) {
            procs.signal(leader, libc::SIGKILL);
            procs.wait(leader);
            killed = true;
        }
        let record = format!("r{i}");
        i += 1;
        if c.append(0, record.as_bytes()).is_ok() {
            confirmed.push(record);
        }
    }
    assert!(killed);
    assert!(confirmed.len() > 10, "appends went on after the failover");
    // The two survivors hold every confirmed append, each exactly once.
    let survivors: Vec<usize> = (0..3).filter(|&i| i as u64 + 1 != leader).collect();
    for &s in &survivors {
        let got = common::wait_for("the survivor to apply", Duration::from_secs(20), || {
            let got = read_all(&mut c, s)?;
            let last = confirmed.last()?.as_bytes().to_vec();
            got.iter().any(|e| e.data == last).then_some(got)
        })
        .0;
        let mut seen: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
        for e in &got {
            *seen.entry(e.data.to_vec()).or_default() += 1;
        }
        for r in &confirmed {
            assert_eq!(seen.get(r.as_bytes()), Some(&1), "node {}: {r}", s + 1);
        }
        assert!(
            seen.values().all(|&n| n == 1),
            "node {}: a record applied twice",
            s + 1
        );
    }
}

#[test]
fn a_bad_config_exits_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("node.toml");
    std::fs::write(
        &cfg,
        "[node]\ncluster_key_file = \"k\"\nauth_token_file = \"t\"\n",
    )
    .unwrap();
    let out = quired_with_config(&cfg);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("node.id"), "{err}");

    // A config (or a key or token file) that never ends is refused at a
    // bound, not read until memory runs out.
    let out = quired_with_config(std::path::Path::new("/dev/zero"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("longer than 1048576 bytes"), "{err}");
    std::fs::write(dir.path().join("t"), "s3cret-token\n").unwrap();
    std::fs::write(
        &cfg,
        "[node]\nid = 1\ncluster_key_file = \"/dev/zero\"\nauth_token_file = \"t\"\n\
         [[peers]]\nid = 2\nudp = \"10.0.0.2:7500\"\n\
         [[disks]]\npath = \"log0\"\ngroup = 0\n",
    )
    .unwrap();
    let out = quired_with_config(&cfg);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("node.cluster_key_file") && err.contains("longer than"),
        "{err}"
    );

    // Raft timers the consensus core cannot run with: its own check
    // refuses them, named by their key, and nothing panics.
    std::fs::write(dir.path().join("k"), "0123456789abcdef0123456789abcdef\n").unwrap();
    std::fs::write(dir.path().join("t"), "s3cret-token\n").unwrap();
    std::fs::write(
        &cfg,
        "[node]\nid = 1\ncluster_key_file = \"k\"\nauth_token_file = \"t\"\n\
         [[peers]]\nid = 2\nudp = \"10.0.0.2:7500\"\n\
         [[disks]]\npath = \"log0\"\ngroup = 0\n\
         [timers]\nheartbeat_interval_ms = 40\nelection_timeout_ms = 40\n",
    )
    .unwrap();
    let out = quired_with_config(&cfg);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("timers.election_timeout_ms: 40 must exceed heartbeat_interval_ms (40)"),
        "{err}"
    );
    assert!(!dir.path().join("log0").exists(), "no log was opened");
}

#[test]
fn a_sighup_is_logged_and_the_daemon_goes_on_serving() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = cluster(dir.path());
    let mut c = client(&procs, 11);
    c.append(0, b"before the hangup").expect("confirmed");
    // Node 2 serves (so it has blocked the signal) before it is sent:
    // its default action would end the daemon with nothing in its log.
    copies(&mut c, 3, 1);
    procs.signal(2, libc::SIGHUP);
    let log = dir.path().join("node2/quired.log");
    common::wait_for("node 2 to log the SIGHUP", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&log).ok()?;
        text.contains("SIGHUP: nothing to reload").then_some(())
    });
    assert!(!procs.has_exited(2), "node 2 runs on after a SIGHUP");
    c.append(0, b"after the hangup").expect("confirmed");
    // Node 2 still applies and serves: its own copy holds both records.
    let all = copies(&mut c, 3, 2);
    let data: Vec<&[u8]> = all[1].iter().map(|(_, d)| d.as_slice()).collect();
    assert_eq!(
        data,
        [&b"before the hangup"[..], &b"after the hangup"[..]],
        "node 2's copy"
    );
    for (id, code) in procs.stop_all() {
        assert_eq!(code, Some(0), "node {id} stops cleanly on SIGTERM");
    }
}

#[test]
fn a_hangup_of_quire_ups_terminal_stops_every_node_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_quire"))
        .args(["up", "--dir"])
        .arg(dir.path().join("up"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Whatever happens below, the cluster does not outlive the test.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            if let Ok(None) = self.0.try_wait() {
                // SAFETY: kill(2) on our own child, not yet reaped.
                unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
                let _ = self.0.wait();
            }
        }
    }
    let stdout = child.stdout.take().unwrap();
    let mut child = KillOnDrop(child);
    let mut lines = BufReader::new(stdout).lines();
    let ready = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.starts_with("Ctrl-C"));
    assert!(ready, "quire up came up");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.0.id() as libc::pid_t, libc::SIGHUP) };
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(child.0.wait().unwrap().success(), "{rest:?}");
    assert!(
        rest.iter()
            .any(|l| l.contains("node 1 exit 0, node 2 exit 0, node 3 exit 0")),
        "{rest:?}"
    );
}

#[test]
fn quire_up_writes_reads_back_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_quire"))
        .args(["up", "--demo-only", "--dir"])
        .arg(dir.path().join("up"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("read back identical from 3 nodes"), "{text}");
    assert!(
        text.contains("node 1 exit 0, node 2 exit 0, node 3 exit 0"),
        "{text}"
    );
}
