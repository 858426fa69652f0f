//! Careless and hostile client input against three real `quired`
//! processes (the hardening issue, items 1 and 3):
//!
//! - an entry larger than `flush_bytes_max` is written (a flush of its
//!   own) on every node, one larger than the group's `entry_bytes_max` is
//!   refused with `TooLarge` before it is proposed, and neither stops a
//!   log: the group keeps serving;
//! - `quire status` raises an ALARM line while a group has no leader;
//! - two clients that share an id (and so a sequence number) with
//!   different bytes: the second is refused with `Conflict`, never
//!   answered with the first one's index, and only the first is stored;
//!   the CLI draws a fresh random id per run.

mod common;

use quire::api::ErrorCode;
use quire::client::{Client, ClientError};
use quire::node::local::processes::LocalProcesses;
use std::process::Command;
use std::time::Duration;

const SERVE_BOUND: Duration = Duration::from_secs(30);

fn client(procs: &LocalProcesses, id: u64) -> Client {
    let mut c = Client::new(procs.client_addrs(), &procs.token, id);
    c.deadline = SERVE_BOUND;
    c
}

/// Every node's committed log, read from that node.
fn read_everywhere(procs: &LocalProcesses, c: &mut Client, until: u64) -> Vec<Vec<Vec<u8>>> {
    (0..procs.nodes.len())
        .map(|i| {
            common::wait_for("the node to apply everything", SERVE_BOUND, || {
                let mut all = Vec::new();
                let mut from = 1;
                loop {
                    let batch = c.read_from(i, 0, from, 64).ok()?;
                    let Some(last) = batch.last().map(|e| e.index) else {
                        break;
                    };
                    from = last + 1;
                    all.extend(batch.into_iter().map(|e| (e.index, e.data)));
                }
                let done = all.last().is_some_and(|(ix, _)| *ix >= until);
                done.then(|| all.into_iter().map(|(_, d)| d.to_vec()).collect())
            })
            .0
        })
        .collect()
}

fn daemon_logs(procs: &LocalProcesses) -> String {
    procs
        .nodes
        .values()
        .map(|n| std::fs::read_to_string(n.config.with_file_name("quired.log")).unwrap_or_default())
        .collect()
}

#[test]
fn large_entries_are_written_and_oversized_ones_refused_without_stopping_a_log() {
    let dir = tempfile::tempdir().unwrap();
    let procs = common::three_daemons(dir.path());
    let mut c = client(&procs, quire::client::random_client_id().unwrap());

    // Twelve 90 KB messages in one produce: a 1.08 MB entry, past the
    // 256 KiB flush_bytes_max (this stopped every replica's log).
    c.queue_create(0, "big", 5).expect("queue created");
    let messages: Vec<Vec<u8>> = (0..12u8).map(|i| vec![i; 90_000]).collect();
    let ids = c
        .produce(0, "big", &messages)
        .expect("the large produce confirms");
    assert_eq!(ids, 0..12);
    // A 3 MiB raw append: larger still, within entry_bytes_max.
    let three_mib = vec![0xA5u8; 3 << 20];
    let big_index = c.append(0, &three_mib).expect("a 3 MiB append confirms");

    // Past the limit: refused with the limit named, before it is proposed.
    match c.append(0, &vec![1u8; 5 << 20]) {
        Err(ClientError::Refused(ErrorCode::TooLarge, why)) => {
            assert!(why.contains("entry_bytes_max"), "{why}");
            assert!(why.contains("bytes"), "{why}");
        }
        other => panic!("a 5 MiB append: {other:?}"),
    }
    let five_messages: Vec<Vec<u8>> = (0..5).map(|_| vec![2u8; 1 << 20]).collect();
    match c.produce(0, "big", &five_messages) {
        Err(ClientError::Refused(ErrorCode::TooLarge, why)) => {
            assert!(why.contains("entry_bytes_max"), "{why}")
        }
        other => panic!("a 5 MiB produce: {other:?}"),
    }

    // The group still serves, and every node holds the large entry.
    let last = c.append(0, b"after").expect("the group keeps serving");
    assert!(last > big_index);
    let logs = read_everywhere(&procs, &mut c, last);
    for log in &logs {
        assert_eq!(log.iter().filter(|d| **d == three_mib).count(), 1);
        assert_eq!(log.last().map(Vec::as_slice), Some(&b"after"[..]));
        assert!(
            log.iter().all(|d| d.len() < 5 << 20),
            "nothing refused was stored"
        );
    }
    let got = c.consume(0, "big", 12, 30_000).expect("consume");
    assert_eq!(got.len(), 12);
    for d in &got {
        assert_eq!(d.data, messages[d.id as usize]);
    }
    let logs = daemon_logs(&procs);
    assert!(!logs.contains("log stopped"), "{logs}");
    assert!(!logs.contains("more than flush_bytes_max"), "{logs}");
}

/// `quire status` against the cluster: its output.
fn quire_status(procs: &LocalProcesses, token: &std::path::Path) -> String {
    let addrs: Vec<String> = procs.client_addrs().iter().map(|a| a.to_string()).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_quire"))
        .args(["status", "--addr", &addrs.join(","), "--token-file"])
        .arg(token)
        .output()
        .expect("quire status runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn quire_status_raises_an_alarm_while_a_group_has_no_leader() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = common::three_daemons(dir.path());
    let token = dir.path().join("client.token");
    let mut c = client(&procs, quire::client::random_client_id().unwrap());
    c.append(0, b"one").expect("a leader serves");
    // With a leader elected and every link up, no node raises an alarm.
    let healthy = common::wait_for("an alarm-free status", SERVE_BOUND, || {
        let s = quire_status(&procs, &token);
        (!s.contains("ALARM") && s.matches("up ").count() >= 3).then_some(s)
    })
    .0;
    assert!(healthy.contains("group"), "{healthy}");

    // Two of three nodes die: the survivor has no leader.
    procs.signal(2, libc::SIGKILL);
    procs.signal(3, libc::SIGKILL);
    let alarmed = common::wait_for("the no-leader alarm", SERVE_BOUND, || {
        let s = quire_status(&procs, &token);
        s.contains("ALARM: group 0 has no leader").then_some(s)
    })
    .0;
    assert!(alarmed.contains("unreachable"), "{alarmed}");
}

#[test]
fn a_reused_client_id_with_other_bytes_is_refused_not_answered_with_another_index() {
    let dir = tempfile::tempdir().unwrap();
    let procs = common::three_daemons(dir.path());
    // Two clients that drew the same id: both start at sequence 1, as two
    // `quire append` runs with a reused pid did.
    let (mut one, mut two) = (client(&procs, 77), client(&procs, 77));
    let first = one.append(0, b"from client one").expect("the first stores");
    match two.append(0, b"from client two") {
        Err(ClientError::Refused(ErrorCode::Conflict, why)) => {
            assert!(why.contains(&format!("index {first}")), "{why}")
        }
        other => panic!("the colliding append: {other:?} (first at {first})"),
    }
    // A true retry (same id, seq and bytes) is still answered with the
    // original index.
    let mut retry = client(&procs, 77);
    assert_eq!(retry.append(0, b"from client one").unwrap(), first);
    let last = one.append(0, b"one's second").unwrap();
    for log in read_everywhere(&procs, &mut one, last) {
        let count = |r: &[u8]| log.iter().filter(|d| d.as_slice() == r).count();
        assert_eq!(count(b"from client one"), 1);
        assert_eq!(count(b"from client two"), 0, "refused, so never stored");
    }

    // The same for a produce: two producers sharing an id and a seq.
    let (mut p1, mut p2) = (client(&procs, 99), client(&procs, 99));
    p1.queue_create(0, "jobs", 5).unwrap();
    let (mut p1b, mut p2b) = (client(&procs, 99), client(&procs, 99));
    let ids = p1b.produce(0, "jobs", &[b"job a".to_vec()]).unwrap();
    match p2b.produce(0, "jobs", &[b"job b".to_vec()]) {
        Err(ClientError::Refused(ErrorCode::Conflict, _)) => {}
        other => panic!("the colliding produce: {other:?} (first got {ids:?})"),
    }
    assert_eq!(p2.queue_list(0).unwrap()[0].produced, 1);
    drop((p1, p2));

    // Two CLI runs: each draws its own random id, so both records are
    // stored, at different indexes.
    let addrs: Vec<String> = procs.client_addrs().iter().map(|a| a.to_string()).collect();
    let token = dir.path().join("client.token");
    let append = |record: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_quire"))
            .args(["append", "--addr", &addrs.join(","), "--token-file"])
            .arg(&token)
            .arg(record)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (a, b) = (append("cli record a"), append("cli record b"));
    assert_ne!(a.split(':').next(), b.split(':').next(), "{a} {b}");
}
