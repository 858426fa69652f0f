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
    assert_eq!(es, want, "read up to the LAC, every entry once");
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
