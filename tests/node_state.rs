//! Ledgers and queues on a running 3-node cluster (threads, real sockets,
//! real logs): commands are applied once per (client, seq) even when
//! retried, queries are linearizable on the leader, snapshots are taken in
//! the background every few entries and carry the ledgers and queues, and
//! a cluster whose every node restarted serves the same state.

mod common;

use quire::consensus::Role;
use quire::node::{LocalCluster, ProposeError};
use quire::state::ledger::LedgerState;
use quire::state::{Answer, Command, Error, Outcome, Query};
use std::time::Duration;

const SLOW: Duration = Duration::from_secs(10);

fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    common::wait_for(what, SLOW, f).0
}

fn leader(c: &LocalCluster) -> u64 {
    wait_for("a leader", || c.agreed_leader()).0
}

#[test]
fn ledgers_and_queues_survive_snapshots_and_a_restart_of_every_node() {
    let dir = tempfile::tempdir().unwrap();
    let logs: Vec<_> = (1..=3).map(|i| dir.path().join(format!("n{i}"))).collect();
    let mut c = LocalCluster::start(&logs, &[0], &[], dir.path(), |spec| {
        spec.raft.snapshot_entries = 16;
    })
    .expect("cluster starts");
    let l = leader(&c);
    let n = &c.nodes[&l];
    let run = |seq: u64, cmd: Command| n.state(0, 7, seq, cmd, SLOW);

    let created = run(
        1,
        Command::CreateLedger {
            writer_token: 99,
            now_ms: 0,
        },
    );
    let Ok(Outcome::LedgerCreated(ledger)) = created else {
        panic!("create: {created:?}");
    };
    for e in 0..40u64 {
        let add = Command::AddEntry {
            ledger,
            writer_token: 99,
            data: format!("entry {e}").into_bytes(),
        };
        assert_eq!(run(100 + e, add), Ok(Outcome::EntryAdded(e)));
    }
    // A retried add (same client and seq) is not added again and gets the
    // entry id of the first.
    let retry = Command::AddEntry {
        ledger,
        writer_token: 99,
        data: b"entry 5".to_vec(),
    };
    assert_eq!(run(105, retry), Ok(Outcome::EntryAdded(5)));
    let wrong = Command::AddEntry {
        ledger,
        writer_token: 1,
        data: vec![],
    };
    assert_eq!(
        run(200, wrong),
        Err(ProposeError::Refused(Error::NotWriter))
    );

    let queue = || "jobs".to_string();
    let create_queue = Command::CreateQueue {
        name: queue(),
        max_deliveries: 100,
    };
    assert_eq!(run(300, create_queue), Ok(Outcome::Done));
    for b in 0..20u64 {
        let produce = Command::Produce {
            queue: queue(),
            producer_id: 5,
            seq: b,
            messages: (0..10).map(|m| format!("{b}.{m}").into_bytes()).collect(),
        };
        let ids = b * 10..b * 10 + 10;
        assert_eq!(
            n.state(0, 0, 0, produce.clone(), SLOW),
            Ok(Outcome::Produced { ids, retry: false })
        );
        if b == 3 {
            // The producer's retry is answered from its window.
            assert_eq!(
                n.state(0, 0, 0, produce, SLOW),
                Ok(Outcome::Produced {
                    ids: 30..40,
                    retry: true
                })
            );
        }
    }
    let consume = Command::Consume {
        queue: queue(),
        consumer: 1,
        max: 50,
        visibility_ms: 60_000,
        now_ms: 0,
    };
    let Ok(Outcome::Consumed(got)) = run(400, consume) else {
        panic!("consume");
    };
    assert_eq!(
        got.iter().map(|d| d.id).collect::<Vec<_>>(),
        (0..50).collect::<Vec<_>>()
    );
    let ack = Command::Ack {
        queue: queue(),
        ids: (0..25).collect(),
    };
    assert_eq!(run(401, ack), Ok(Outcome::Acked(25)));

    // Every node took snapshots (in the background) holding this state.
    wait_for("every node to snapshot", || {
        let all = c.statuses();
        (all.len() == 3 && all.iter().all(|s| s.groups[0].snapshot.taken >= 2)).then_some(())
    });
    let before = c.statuses();
    assert!(
        before
            .iter()
            .all(|s| s.groups[0].snapshot.last_bytes > 40 * 8),
        "the snapshot holds the ledger's entries"
    );

    // Restart every node: each loads its newest snapshot and replays the
    // log after it.
    for id in 1..=3 {
        c.restart_node(id).unwrap();
    }
    let l = leader(&c);
    let n = &c.nodes[&l];
    let info = n.query(0, Query::Ledger { ledger }, SLOW);
    let Ok(Answer::Ledger(info)) = info else {
        panic!("ledger info: {info:?}");
    };
    assert_eq!(
        (info.length, info.lac, info.state),
        (40, Some(38), LedgerState::Open)
    );
    let read = n.query(
        0,
        Query::ReadLedger {
            ledger,
            from: 0,
            to: 100,
        },
        SLOW,
    );
    let Ok(Answer::Entries(es)) = read else {
        panic!("read: {read:?}");
    };
    let want: Vec<(u64, Vec<u8>)> = (0..39)
        .map(|e| (e, format!("entry {e}").into_bytes()))
        .collect();
    let got: Vec<(u64, Vec<u8>)> = es.into_iter().map(|e| (e.id, e.data)).collect();
    assert_eq!(got, want, "read up to the LAC, every entry once");
    // Those entries are below the snapshot: their bytes came back by cold
    // reads on the ring (the loop did not wait for them).
    let wal = n.status().unwrap().groups[0].wal;
    assert!(
        wal.cold_reads >= 1 && wal.cold_read_errors == 0,
        "read back from the segments: {wal:?}"
    );
    let Ok(Answer::Queues(qs)) = n.query(0, Query::ListQueues, SLOW) else {
        panic!("list");
    };
    assert_eq!((qs[0].produced, qs[0].unacked), (200, 175));
    // The 25 unacked deliveries are still hidden; the rest come in order,
    // and no acked message comes back.
    let consume = Command::Consume {
        queue: queue(),
        consumer: 1,
        max: 1000,
        visibility_ms: 60_000,
        now_ms: 0,
    };
    let Ok(Outcome::Consumed(got)) = n.state(0, 8, 1, consume, SLOW) else {
        panic!("consume after restart");
    };
    assert_eq!(
        got.iter().map(|d| d.id).collect::<Vec<_>>(),
        (50..200).collect::<Vec<_>>()
    );

    // Queries are served by the leader only.
    let follower = c
        .statuses()
        .into_iter()
        .find(|s| s.groups[0].role == Role::Follower)
        .unwrap()
        .id;
    let r = c.nodes[&follower].query(0, Query::ListLedgers, SLOW);
    assert!(matches!(r, Err(ProposeError::NotLeader(_))), "{r:?}");
}

#[test]
fn a_fenced_writer_gets_no_confirm_after_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let logs: Vec<_> = (1..=3).map(|i| dir.path().join(format!("n{i}"))).collect();
    let c = LocalCluster::start(&logs, &[0], &[], dir.path(), |_| {}).expect("cluster starts");
    let n = &c.nodes[&leader(&c)];
    let Ok(Outcome::LedgerCreated(ledger)) = n.state(
        0,
        1,
        1,
        Command::CreateLedger {
            writer_token: 5,
            now_ms: 0,
        },
        SLOW,
    ) else {
        panic!("create");
    };
    let add = |seq: u64| {
        let cmd = Command::AddEntry {
            ledger,
            writer_token: 5,
            data: vec![seq as u8],
        };
        n.state(0, 1, seq, cmd, SLOW)
    };
    assert_eq!(add(2), Ok(Outcome::EntryAdded(0)));
    assert_eq!(add(3), Ok(Outcome::EntryAdded(1)));
    let sealed = n.state(0, 2, 1, Command::OpenRecover { ledger }, SLOW);
    assert_eq!(sealed, Ok(Outcome::Sealed(Some(1))));
    assert_eq!(add(4), Err(ProposeError::Refused(Error::Fenced)));
}

/// Ids of the log segment files in `dir` (spares included), ascending.
fn segment_ids(dir: &std::path::Path) -> Vec<u64> {
    let mut ids: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            u64::from_str_radix(name.strip_suffix(".seg")?, 16).ok()
        })
        .collect();
    ids.sort_unstable();
    ids
}

/// The bytes of ledger entries and messages live in the log, not in the
/// state: the log keeps the segment of an unacked message through every
/// snapshot and releases it once the message is acked; a follower that
/// fell behind the trimmed log gets the snapshot together with the entries
/// its state refers to, and holds them in its own log afterwards.
#[test]
fn the_log_keeps_what_the_state_refers_to_and_a_lagging_follower_gets_it() {
    let dir = tempfile::tempdir().unwrap();
    let logs: Vec<_> = (1..=3).map(|i| dir.path().join(format!("n{i}"))).collect();
    let mut c = LocalCluster::start(&logs, &[0], &[], dir.path(), |spec| {
        spec.raft.snapshot_entries = 16;
        spec.snapshot_interval_ms = 100;
        spec.wal.segment_bytes = 512 << 10;
    })
    .expect("cluster starts");
    let l = leader(&c);
    let log_of = |c: &LocalCluster, id: u64| c.spec(id).unwrap().groups[0].dir.clone();
    let queue = || "q".to_string();
    let produce = |c: &LocalCluster, seq: u64, messages: Vec<Vec<u8>>| {
        let p = Command::Produce {
            queue: queue(),
            producer_id: 1,
            seq,
            messages,
        };
        let r = c.nodes[&l].state(0, 0, 0, p, SLOW);
        assert!(matches!(r, Ok(Outcome::Produced { .. })), "{r:?}");
    };
    let create = Command::CreateQueue {
        name: queue(),
        max_deliveries: 100,
    };
    assert_eq!(c.nodes[&l].state(0, 0, 0, create, SLOW), Ok(Outcome::Done));
    let pinned: Vec<Vec<u8>> = (0..4).map(|i| format!("pinned {i}").into_bytes()).collect();
    produce(&c, 0, pinned.clone());

    // A follower stops; about 2 MB more is produced, consumed and acked,
    // all but the first four messages.
    let f = (1..=3).find(|&id| id != l).unwrap();
    c.stop_node(f);
    for b in 1..=200u64 {
        let big = (0..8).map(|m| {
            let mut v = format!("bulk {b}.{m} ").into_bytes();
            v.resize(1200, b as u8);
            v
        });
        produce(&c, b, big.collect());
    }
    let mut seq = 1;
    loop {
        let consume = Command::Consume {
            queue: queue(),
            consumer: 1,
            max: 1024,
            visibility_ms: 600_000,
            now_ms: 0,
        };
        seq += 1;
        let Ok(Outcome::Consumed(got)) = c.nodes[&l].state(0, 9, seq, consume, SLOW) else {
            panic!("consume");
        };
        if got.is_empty() {
            break;
        }
        for d in &got {
            let want = if d.id < 4 {
                pinned[d.id as usize].clone()
            } else {
                let (b, m) = ((d.id - 4) / 8 + 1, (d.id - 4) % 8);
                let mut v = format!("bulk {b}.{m} ").into_bytes();
                v.resize(1200, b as u8);
                v
            };
            assert_eq!(d.data, want, "message {} read back from the log", d.id);
        }
        let ids: Vec<u64> = got.iter().map(|d| d.id).filter(|&id| id >= 4).collect();
        seq += 1;
        let ack = Command::Ack {
            queue: queue(),
            ids,
        };
        assert!(matches!(
            c.nodes[&l].state(0, 9, seq, ack, SLOW),
            Ok(Outcome::Acked(_))
        ));
    }

    // Snapshots came and went past several segments; the first one, which
    // holds the unacked messages, stays.
    let commit = c.nodes[&l].status().unwrap().groups[0].commit;
    wait_for("the leader to snapshot past the bulk", || {
        let s = c.nodes[&l].status()?.groups[0].snapshot;
        (s.last_index >= commit).then_some(())
    });
    let ids = segment_ids(&log_of(&c, l));
    assert_eq!(
        ids[0], 1,
        "the segment the unacked messages are in is kept: {ids:?}"
    );
    assert!(ids.len() >= 4, "the log spans several segments: {ids:?}");
    let pinned_from = c.nodes[&l].status().unwrap().groups[0]
        .snapshot
        .retained_from;
    assert!(
        (1..commit / 2).contains(&pinned_from),
        "status shows where the kept log starts: {pinned_from}"
    );

    // The follower comes back behind the leader's snapshot: it installs
    // the snapshot and the entries from the unacked messages' on.
    c.restart_node(f).unwrap();
    wait_for("the follower to catch up", || {
        let s = c.nodes[&f].status()?;
        let g = &s.groups[0];
        (g.stats.snapshots_installed >= 1 && g.applied >= commit).then_some(())
    });
    c.stop_node(f);
    let spec = c.spec(f).unwrap().clone();
    let (mut wal, report) = quire::storage::Wal::open(&log_of(&c, f), spec.wal.clone()).unwrap();
    let snapshot_index = report.restored.snapshot.as_ref().unwrap().index;
    let held = (1..snapshot_index)
        .filter_map(|i| wal.read(i, i).ok()?.pop())
        .find_map(|e| match e.payload {
            quire::consensus::Payload::Normal(p) => quire::state::query::decode_commands(&p)
                .into_iter()
                .find_map(|c| match c {
                    Command::Produce {
                        messages, seq: 0, ..
                    } => Some((e.index, messages)),
                    _ => None,
                }),
            _ => None,
        });
    let (at, messages) = held.expect("the follower's log holds the unacked messages' produce");
    assert!(
        at < snapshot_index,
        "kept below the snapshot ({at} < {snapshot_index})"
    );
    assert_eq!(messages, pinned);

    // A damaged log: the segment holding those messages is lost. The node
    // still starts (its followers' copies are intact) and says what it
    // cannot serve.
    let (segment, _) = wal.locate(at, at).unwrap().remove(0);
    let segment = wal.dir().root().join(segment);
    drop(wal);
    std::fs::remove_file(&segment).unwrap();
    c.restart_node(f).unwrap();
    wait_for("the damaged node to report what it cannot read", || {
        let s = c.nodes[&f].status()?.groups[0].snapshot;
        (s.unreadable_entries >= 1).then_some(())
    });

    // Once acked, the messages' segment goes at the next snapshot.
    let ack = Command::Ack {
        queue: queue(),
        ids: (0..4).collect(),
    };
    let l = leader(&c);
    assert_eq!(
        c.nodes[&l].state(0, 10, 1, ack, SLOW),
        Ok(Outcome::Acked(4))
    );
    let commit = c.nodes[&l].status().unwrap().groups[0].commit;
    wait_for("the acked prefix's segments to be released", || {
        let s = c.nodes[&l].status()?.groups[0].snapshot;
        let first = segment_ids(&log_of(&c, l))[0];
        (s.last_index >= commit && first > 1).then_some(())
    });
    let from = c.nodes[&l].status().unwrap().groups[0]
        .snapshot
        .retained_from;
    assert!(
        from == 0 || from > pinned_from,
        "moved past the acked messages: {from}"
    );
}

/// A ledger read with a wait that finds nothing past the LAC waits on the
/// leader and is answered when an entry is confirmed, not at its deadline;
/// one that sees nothing confirmed before its deadline gets nothing.
#[test]
fn a_waiting_ledger_read_is_answered_when_the_lac_moves() {
    let dir = tempfile::tempdir().unwrap();
    let logs: Vec<_> = (1..=3).map(|i| dir.path().join(format!("n{i}"))).collect();
    let c = LocalCluster::start(&logs, &[0], &[], dir.path(), |_| {}).expect("cluster starts");
    let l = leader(&c);
    let n = &c.nodes[&l];
    let create = Command::CreateLedger {
        writer_token: 5,
        now_ms: 0,
    };
    let Ok(Outcome::LedgerCreated(ledger)) = n.state(0, 1, 1, create, SLOW) else {
        panic!("create");
    };
    let read = |from| Query::ReadLedger {
        ledger,
        from,
        to: u64::MAX,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let sent = tx.clone();
    n.query_waiting(0, read(0), 60_000, Box::new(move |r| sent.send(r).unwrap()));
    wait_for("the read to wait on the leader", || {
        (n.status()?.groups[0].waiting_reads == 1).then_some(())
    });
    for (seq, data) in [(2, b"a"), (3, b"b")] {
        let add = Command::AddEntry {
            ledger,
            writer_token: 5,
            data: data.to_vec(),
        };
        assert!(n.state(0, 1, seq, add, SLOW).is_ok());
    }
    // Adding entry 1 confirmed entry 0: the waiting read gets it now, well
    // before its 60 s deadline.
    let got = rx.recv_timeout(Duration::from_secs(30)).expect("answered");
    let Ok(Answer::Entries(es)) = got else {
        panic!("{got:?}");
    };
    let es: Vec<(u64, Vec<u8>)> = es.into_iter().map(|e| (e.id, e.data)).collect();
    assert_eq!(es, vec![(0, b"a".to_vec())]);
    assert_eq!(n.status().unwrap().groups[0].waiting_reads, 0);

    // Nothing past entry 1 is confirmed: a short wait ends empty.
    n.query_waiting(0, read(1), 200, Box::new(move |r| tx.send(r).unwrap()));
    let got = rx.recv_timeout(Duration::from_secs(30)).expect("answered");
    assert!(
        matches!(&got, Ok(Answer::Entries(es)) if es.is_empty()),
        "{got:?}"
    );
}

/// A tail of the raw log waits on the node's loop and is answered when an
/// entry is applied there, not at its deadline; a follower's tail too.
#[test]
fn a_raw_log_tail_is_answered_when_an_entry_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let logs: Vec<_> = (1..=3).map(|i| dir.path().join(format!("n{i}"))).collect();
    let c = LocalCluster::start(&logs, &[0], &[], dir.path(), |_| {}).expect("cluster starts");
    let l = leader(&c);
    let first = c.nodes[&l]
        .append(0, 1, 1, b"before".to_vec(), SLOW)
        .unwrap();
    let follower = (1..=3).find(|&id| id != l).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for id in [l, follower] {
        let sent = tx.clone();
        let reply = Box::new(move |r| sent.send((id, r)).unwrap());
        c.nodes[&id].read_waiting(0, first + 1, 100, usize::MAX, 60_000, id != l, reply);
    }
    wait_for("both tails to wait", || {
        let waiting = |id| Some(c.nodes[&id].status()?.groups[0].waiting_reads);
        (waiting(l)? == 1 && waiting(follower)? == 1).then_some(())
    });
    let at = c.nodes[&l]
        .append(0, 1, 2, b"after".to_vec(), SLOW)
        .unwrap();
    for _ in 0..2 {
        let (id, got) = rx.recv_timeout(Duration::from_secs(30)).expect("answered");
        let got = got.unwrap();
        assert_eq!(got.len(), 1, "node {id}: {got:?}");
        assert_eq!((got[0].0, &got[0].2[..]), (at, &b"after"[..]), "node {id}");
    }
    // Nothing after it: a short wait ends empty.
    let reply = Box::new(move |r| tx.send((l, r)).unwrap());
    c.nodes[&l].read_waiting(0, at + 1, 100, usize::MAX, 200, false, reply);
    let (_, got) = rx.recv_timeout(Duration::from_secs(30)).expect("answered");
    assert_eq!(got.unwrap(), vec![]);
}
