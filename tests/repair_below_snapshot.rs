//! Repair below the snapshot on three real `quired` processes (127.0.0.1
//! only, PTY cables): a follower whose log lost one segment and had
//! another rot, both below its snapshot and holding unacked messages,
//! repairs them from its peers at its next start with no operator action
//! (each copy checked against what its state recorded), leads only once
//! done, and then every message is consumable with each node as leader
//! in turn. And the background scrub finds rot under a running follower,
//! which repairs it the same way without a restart.
//!
//! Nothing here sleeps to synchronise: it polls with a generous deadline.

mod common;

use quire::client::Client;
use quire::node::local::processes::LocalProcesses;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);
/// Produce entries of 40 KiB in segments of 2 MiB: the messages fill a
/// few segments, which later entries and snapshots leave below the
/// snapshot, kept only because the messages are unacked.
const BATCHES: u64 = 200;
const PER_BATCH: u64 = 40;
const MESSAGE_BYTES: usize = 1024;

fn cluster(dir: &Path, scrub_bytes_per_s: u64) -> LocalProcesses {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_quired"));
    let mut procs = LocalProcesses::prepare(dir, 3, 1, &exe).expect("cluster prepared");
    for node in procs.nodes.values() {
        let text = std::fs::read_to_string(&node.config).unwrap();
        let text = text.replacen("segment_bytes = 8388608", "segment_bytes = 2097152", 1);
        assert!(text.contains("segment_bytes = 2097152"), "{text}");
        // Leadership is moved by the test alone.
        let text = text.replacen(
            "segment_bytes = 2097152",
            &format!("segment_bytes = 2097152\nscrub_bytes_per_s = {scrub_bytes_per_s}"),
            1,
        );
        let text =
            format!("{text}\n[snapshot]\nentries = 64\n\n[timers]\npreferred_leaders = false\n");
        std::fs::write(&node.config, text).unwrap();
    }
    procs.start_all().expect("daemons start");
    procs
}

fn client(procs: &LocalProcesses) -> Client {
    let id = quire::client::random_client_id().unwrap();
    let mut c = Client::new(procs.client_addrs(), &procs.token, id);
    c.deadline = LIMIT;
    c
}

fn status(procs: &LocalProcesses, id: u64) -> Option<serde_json::Value> {
    common::admin_status(procs.nodes[&id].admin, Duration::from_secs(5))
}

/// The node leading group 0 in the highest term (one that was stopped
/// may still think it leads an older one).
fn leader(procs: &LocalProcesses) -> u64 {
    leader_among(procs, |_| true)
}

fn leader_among(procs: &LocalProcesses, consider: impl Fn(u64) -> bool) -> u64 {
    common::wait_for("a leader", LIMIT, || {
        procs
            .nodes
            .keys()
            .copied()
            .filter(|&id| consider(id))
            .filter_map(|id| {
                let v = status(procs, id)?;
                let g = &v["groups"][0];
                (g["role"] == "leader").then(|| (g["term"].as_u64().unwrap_or(0), id))
            })
            .max()
            .map(|(_, id)| id)
    })
    .0
}

fn message(id: u64) -> Vec<u8> {
    let mut m = format!("message {id} ").into_bytes();
    m.resize(MESSAGE_BYTES, b'.');
    m
}

/// The node's segment files, oldest first.
fn segments(procs: &LocalProcesses, id: u64) -> Vec<PathBuf> {
    let log = procs.nodes[&id].config.with_file_name("log0");
    let mut segs: Vec<PathBuf> = std::fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    segs
}

/// Every message, each consumed at least once through the leader `id`
/// (hidden for a moment only, so the next round sees them again).
fn consume_all(c: &mut Client, procs: &LocalProcesses, id: u64, expected: &BTreeMap<u64, Vec<u8>>) {
    let mut seen = BTreeMap::new();
    common::wait_for("every message consumed", LIMIT, || {
        for d in c.consume(0, "work", 1000, 200).expect("consume") {
            assert_eq!(Some(&d.data), expected.get(&d.id), "message {}", d.id);
            seen.insert(d.id, ());
        }
        (seen.len() == expected.len()).then_some(())
    });
    assert_eq!(leader(procs), id, "node {id} led throughout");
}

/// A cluster holding `BATCHES * PER_BATCH` unacked messages below every
/// node's snapshot: the client, the messages by id, and a follower.
fn holding_messages(procs: &LocalProcesses) -> (Client, BTreeMap<u64, Vec<u8>>, u64) {
    let mut c = client(procs);
    c.queue_create(0, "work", 1000).expect("queue created");
    let mut expected = BTreeMap::new();
    for b in 0..BATCHES {
        let batch: Vec<Vec<u8>> = (0..PER_BATCH).map(|m| message(b * PER_BATCH + m)).collect();
        let ids = c.produce(0, "work", &batch).expect("produce");
        for (id, m) in ids.zip(batch) {
            expected.insert(id, m);
        }
    }
    // More entries, so every node's snapshot passes the messages' entries.
    for i in 0..300u32 {
        c.append(0, &i.to_le_bytes()).expect("append");
    }
    let l = leader(procs);
    let follower = *procs.nodes.keys().find(|&&id| id != l).unwrap();
    let commit = status(procs, l).unwrap()["groups"][0]["commit"]
        .as_u64()
        .unwrap();
    common::wait_for("the follower's snapshot past the messages", LIMIT, || {
        let v = status(procs, follower)?;
        let g = &v["groups"][0];
        (g["snapshot"]["index"].as_u64()? > BATCHES + 1 && g["applied"].as_u64()? >= commit)
            .then_some(())
    });
    (c, expected, follower)
}

/// Every node in turn leads and serves every message: stop the leader
/// (SIGSTOP: it comes back as it was) until the node wanted leads.
fn every_node_serves_every_message(
    c: &mut Client,
    procs: &mut LocalProcesses,
    expected: &BTreeMap<u64, Vec<u8>>,
) {
    for want in procs.nodes.keys().copied().collect::<Vec<_>>() {
        common::wait_for("the wanted leader", LIMIT, || {
            let l = leader(procs);
            if l == want {
                return Some(());
            }
            procs.signal(l, libc::SIGSTOP);
            leader_among(procs, |id| id != l);
            procs.signal(l, libc::SIGCONT);
            None
        });
        consume_all(c, procs, want, expected);
    }
}

#[test]
fn a_follower_repairs_lost_and_rotten_segments_below_the_snapshot_from_its_peers() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = cluster(dir.path(), 0);
    let (mut c, expected, follower) = holding_messages(&procs);

    // The follower stops; its oldest segment is lost, and the next one
    // rots in the middle.
    procs.signal(follower, libc::SIGTERM);
    assert_eq!(procs.wait(follower), Some(0));
    let segs = segments(&procs, follower);
    assert!(
        segs.len() >= 4,
        "the messages span several segments: {segs:?}"
    );
    std::fs::remove_file(&segs[0]).unwrap();
    let mut bytes = std::fs::read(&segs[1]).unwrap();
    for b in &mut bytes[200_000..200_100] {
        *b ^= 0x5a;
    }
    std::fs::write(&segs[1], bytes).unwrap();

    // At its start it finds them missing and repairs them, unasked.
    procs.start(follower).unwrap();
    let log_path = procs.nodes[&follower].config.with_file_name("quired.log");
    let (repair, _) = common::wait_for("the repair", LIMIT, || {
        let v = status(&procs, follower)?;
        let r = v["groups"][0]["repair"].clone();
        (r["repaired"].as_u64()? > 0 && r["missing"].as_u64()? == 0).then_some(r)
    });
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("repairing them from a peer"), "{log}");
    assert!(log.contains("repaired"), "{log}");
    assert_eq!(repair["rejected"], 0, "{repair}");
    assert_eq!(repair["lost"], 0, "{repair}");
    let served: u64 = procs
        .nodes
        .keys()
        .filter(|&&id| id != follower)
        .map(|&id| {
            status(&procs, id).unwrap()["groups"][0]["repair"]["served"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert!(
        served >= repair["repaired"].as_u64().unwrap(),
        "served what it took"
    );
    let files = std::fs::read_dir(procs.nodes[&follower].config.with_file_name("log0"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".rep")
        })
        .count();
    assert!(files > 0, "the repaired copies are on disk");

    every_node_serves_every_message(&mut c, &mut procs, &expected);
}

/// The background scrub finds batches below the snapshot that rotted
/// under a running follower (no restart), which repairs them from its
/// peers; `quire status` shows the scrub's last full pass.
#[test]
fn the_scrub_finds_rot_under_a_running_follower_which_repairs_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = cluster(dir.path(), 64 << 20);
    let (mut c, expected, follower) = holding_messages(&procs);
    let uptime = |procs: &LocalProcesses| status(procs, follower).unwrap()["uptime_ms"].as_u64();
    let up_before = uptime(&procs).unwrap();
    // The oldest segment, below the snapshot, rots in many places.
    let seg = segments(&procs, follower).remove(0);
    let mut bytes = std::fs::read(&seg).unwrap();
    for at in (8192..bytes.len() - 200).step_by(64 << 10) {
        for b in &mut bytes[at..at + 100] {
            *b ^= 0x5a;
        }
    }
    std::fs::write(&seg, bytes).unwrap();
    let (g, _) = common::wait_for("the scrub's finding repaired", LIMIT, || {
        let v = status(&procs, follower)?;
        let g = v["groups"][0].clone();
        (g["scrub"]["damaged_batches"].as_u64()? > 0
            && g["repair"]["repaired"].as_u64()? > 0
            && g["repair"]["missing"].as_u64()? == 0
            && g["scrub"]["passes"].as_u64()? > 0)
            .then_some(g)
    });
    assert!(uptime(&procs).unwrap() > up_before, "no restart");
    assert_eq!(g["repair"]["rejected"], 0, "{g}");
    let log = std::fs::read_to_string(procs.nodes[&follower].config.with_file_name("quired.log"))
        .unwrap();
    assert!(log.contains("the scrub found the batch"), "{log}");
    let addrs: Vec<String> = procs.client_addrs().iter().map(|a| a.to_string()).collect();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quire"))
        .args(["status", "--addr", &addrs.join(","), "--token-file"])
        .arg(procs.dir.join("client.token"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("group 0 log: scrub's last full pass ended"),
        "{text}"
    );
    every_node_serves_every_message(&mut c, &mut procs, &expected);
}
