//! Ledgers and queues end to end on three real `quired` processes (random
//! free ports, temp dirs, PTY null-modem cables), through the client
//! library and the client protocol:
//!
//! - a writer appends to a ledger while a second client opens it with
//!   recovery: the writer is fenced, gets no confirm for an add it sent
//!   after the fence, and the reader sees exactly the entries up to the
//!   sealed id, every confirmed one among them;
//! - 100,000 messages are produced, consumed and acked with a SIGKILL of
//!   the leader while producing and another while consuming, then every
//!   node is killed and restarted: every produced message was delivered,
//!   none was produced twice by a retry, and no acked message comes back;
//! - a ledger holding more than a client frame reads back whole through
//!   `quire ledger read`, page by page.

mod common;

use quire::api::ErrorCode;
use quire::client::{Client, ClientError};
use quire::node::local::processes::LocalProcesses;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Three daemons that snapshot every 64 entries, so restarts restore the
/// ledgers and queues from a snapshot plus the log after it.
fn cluster(dir: &std::path::Path) -> LocalProcesses {
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_quired"));
    let procs = LocalProcesses::prepare(dir, 3, 1, &exe).expect("cluster prepared");
    for node in procs.nodes.values() {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&node.config)
            .unwrap();
        writeln!(f, "\n[snapshot]\nentries = 64").unwrap();
    }
    let mut procs = procs;
    procs.start_all().expect("daemons start");
    procs
}

fn client(procs: &LocalProcesses, id: u64) -> Client {
    let mut c = Client::new(procs.client_addrs(), &procs.token, id);
    c.deadline = Duration::from_secs(30);
    c
}

/// The node leading group 0, as some node reports it.
fn leader(c: &mut Client, nodes: usize) -> u64 {
    common::wait_for("a leader", Duration::from_secs(20), || {
        (0..nodes).find_map(|i| {
            let l = c.leaders(i).ok()?.first()?.leader;
            (l != 0).then_some(l)
        })
    })
    .0
}

#[test]
fn recovery_fences_the_writer_and_the_reader_sees_every_confirmed_entry() {
    let dir = tempfile::tempdir().unwrap();
    let procs = cluster(dir.path());
    let mut writer = client(&procs, 1);
    let w = writer.ledger_create(0).expect("ledger created");
    let confirmed_count = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&confirmed_count);
    // The writer appends until it is fenced, recording for each add when
    // it was sent and how it ended.
    let writing = std::thread::spawn(move || {
        let mut log = Vec::new();
        for k in 0u64.. {
            let sent = Instant::now();
            let r = writer.ledger_append(0, w, format!("e{k}").as_bytes());
            let fenced = matches!(&r, Err(ClientError::Refused(ErrorCode::Fenced, _)));
            if r.is_ok() {
                count.fetch_add(1, Ordering::Relaxed);
            }
            log.push((k, sent, r));
            if fenced || k > 100_000 {
                break;
            }
        }
        log
    });
    common::wait_for("50 confirmed adds", Duration::from_secs(30), || {
        (confirmed_count.load(Ordering::Relaxed) >= 50).then_some(())
    });
    let mut reader = client(&procs, 2);
    let info = reader
        .ledger_open(0, w.id, true)
        .expect("opened with recovery");
    let fenced_at = Instant::now();
    let log = writing.join().unwrap();

    assert!(info.fenced, "{info:?}");
    let (_, _, last) = log.last().unwrap();
    assert!(
        matches!(last, Err(ClientError::Refused(ErrorCode::Fenced, _))),
        "the writer ends fenced: {last:?}"
    );
    // Confirmed adds got dense ids in order, all within the sealed range,
    // and none was sent after the fence completed.
    let confirmed: Vec<(u64, u64)> = log
        .iter()
        .filter_map(|(k, sent, r)| {
            let id = *r.as_ref().ok()?;
            assert!(
                *sent < fenced_at,
                "add {k} sent after the fence was confirmed"
            );
            Some((*k, id))
        })
        .collect();
    assert!(confirmed.len() >= 50);
    for (i, &(k, id)) in confirmed.iter().enumerate() {
        assert_eq!((k, id), (i as u64, i as u64), "dense ids, one per add");
    }
    assert!(confirmed.len() as u64 <= info.length);
    assert_eq!(info.lac, info.length.checked_sub(1), "sealed: all readable");

    // The reader sees exactly the sealed entries; every confirmed one is
    // there with its data. An add whose answer was lost may be there too
    // (it committed), but nothing past the seal.
    let mut got = Vec::new();
    while (got.len() as u64) < info.length {
        let page = reader
            .ledger_read(0, w.id, got.len() as u64, u64::MAX)
            .expect("read");
        assert!(!page.is_empty(), "entries up to the sealed id are readable");
        got.extend(page);
    }
    assert_eq!(got.len() as u64, info.length);
    for (i, (id, data)) in got.iter().enumerate() {
        assert_eq!(*id, i as u64);
        assert_eq!(data, format!("e{i}").as_bytes(), "entry {i}");
    }
    let past = reader.ledger_read(0, w.id, info.length, u64::MAX).unwrap();
    assert!(past.is_empty(), "nothing past the seal: {past:?}");
}

#[test]
fn a_ledger_holding_more_than_a_frame_reads_back_whole_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let procs = cluster(dir.path());
    let mut writer = client(&procs, 3);
    let w = writer.ledger_create(0).expect("ledger created");
    // 18 entries of about 1 MB: more than one client frame (16 MiB) holds.
    let entry = |k: u8| vec![b'a' + k; 1_000_000];
    for k in 0..18 {
        writer.ledger_append(0, w, &entry(k)).expect("added");
    }
    writer.ledger_close(0, w).expect("closed");
    let addrs: Vec<String> = procs.client_addrs().iter().map(|a| a.to_string()).collect();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quire"))
        .args(["ledger", "read", "--ledger", &w.id.to_string(), "--addr"])
        .arg(addrs.join(","))
        .arg("--token-file")
        .arg(procs.dir.join("client.token"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&[u8]> = out
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(lines.len(), 18, "every entry, each once");
    for (k, line) in lines.iter().enumerate() {
        let want = [format!("{k}\t").into_bytes(), entry(k as u8)].concat();
        assert!(*line == want.as_slice(), "entry {k} as written");
    }
}

#[test]
fn a_hundred_thousand_messages_survive_leader_kills_and_a_full_restart() {
    const MESSAGES: u64 = 100_000;
    const BATCH: u64 = 500;
    let dir = tempfile::tempdir().unwrap();
    let mut procs = cluster(dir.path());
    let mut c = client(&procs, 3);
    c.queue_create(0, "work", 1000).expect("queue created");

    // Produce, killing the leader halfway (the client retries the batch
    // with the same producer seq: no duplicate).
    let mut payload_of: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut killed = Vec::new();
    for b in 0..MESSAGES / BATCH {
        if b == MESSAGES / BATCH / 2 {
            let l = leader(&mut c, 3);
            procs.signal(l, libc::SIGKILL);
            procs.wait(l);
            killed.push(l);
        }
        if b == MESSAGES / BATCH / 2 + 20 {
            procs.start(killed[0]).unwrap();
        }
        let batch: Vec<Vec<u8>> = (0..BATCH)
            .map(|m| format!("m{}", b * BATCH + m).into_bytes())
            .collect();
        let ids = c.produce(0, "work", &batch).expect("produce confirmed");
        assert_eq!(ids.end - ids.start, BATCH);
        for (id, data) in ids.zip(batch) {
            assert!(payload_of.insert(id, data).is_none(), "id {id} given twice");
        }
    }
    let info = c.queue_list(0).unwrap();
    assert_eq!(
        info[0].produced, MESSAGES,
        "a retried produce added nothing"
    );

    // Consume and ack everything, killing the leader halfway. A consume
    // whose answer was lost hands its messages to nobody: they come back
    // after the visibility timeout.
    let mut acked: BTreeSet<u64> = BTreeSet::new();
    let mut delivered: BTreeSet<u64> = BTreeSet::new();
    let mut second_kill = false;
    let deadline = Instant::now() + Duration::from_secs(240);
    while (acked.len() as u64) < MESSAGES {
        assert!(
            Instant::now() < deadline,
            "{} of {MESSAGES} acked",
            acked.len()
        );
        if !second_kill && acked.len() as u64 >= MESSAGES / 2 {
            let l = leader(&mut c, 3);
            procs.signal(l, libc::SIGKILL);
            procs.wait(l);
            procs.start(l).unwrap();
            second_kill = true;
        }
        let got = c.consume(0, "work", 1000, 2_000).expect("consume");
        for d in &got {
            assert!(
                !acked.contains(&d.id),
                "acked message {} delivered again",
                d.id
            );
            assert_eq!(
                Some(&d.data),
                payload_of.get(&d.id),
                "message {} carries what was produced",
                d.id
            );
            delivered.insert(d.id);
        }
        let ids: Vec<u64> = got.iter().map(|d| d.id).collect();
        for chunk in ids.chunks(1000) {
            c.ack(0, "work", chunk).expect("ack confirmed");
        }
        acked.extend(ids);
        if got.is_empty() {
            std::thread::sleep(Duration::from_millis(50)); // pace while hidden ones return
        }
    }
    assert!(second_kill);
    assert_eq!(
        delivered.len() as u64,
        MESSAGES,
        "every produced message was delivered"
    );

    // Snapshots were taken along the way (every 64 entries), so the
    // restart below restores from one and replays the log after it.
    let snapshots: u64 = (0..3)
        .filter_map(|i| {
            let json: serde_json::Value = serde_json::from_str(&c.status(i).ok()?).ok()?;
            json["groups"][0]["snapshot"]["taken"].as_u64()
        })
        .sum();
    assert!(snapshots > 0, "no node took a snapshot");
    // Kill every node and start them again: the acks were replicated, so
    // nothing comes back.
    for id in 1..=3 {
        procs.signal(id, libc::SIGKILL);
        procs.wait(id);
    }
    procs.start_all().unwrap();
    let mut c = client(&procs, 4);
    let info = common::wait_for(
        "the restarted cluster to serve",
        Duration::from_secs(30),
        || c.queue_list(0).ok(),
    )
    .0;
    assert_eq!(
        (info[0].produced, info[0].unacked, info[0].dead),
        (MESSAGES, 0, 0)
    );
    let again = c.consume(0, "work", 1000, 2_000).unwrap();
    assert!(
        again.is_empty(),
        "acked messages delivered after restart: {again:?}"
    );
}
