//! The replica's glue, driven step by step: a real WAL in a temporary
//! directory, a test host (`ManualHost`: its clock moves and its jobs run
//! when the test says), and the Raft core stepped by hand. These are the
//! properties the simulator checks on every seed once it drives
//! `Replica`: a message that vouches for a write leaves only once the
//! write is durable, and a snapshot is adopted only once its job ran and
//! the log is durable up to it.

use super::Replica;
use crate::consensus::{
    AppendResult, Body, Entry, Index, Membership, Message, NodeId, Payload, Raft, RaftConfig, Role,
    Snapshot,
};
use crate::io::BackendChoice;
use crate::node::loops::host::Host;
use crate::sim::host::ManualHost;
use crate::storage::{OsDir, Wal, WalConfig};
use std::path::Path;

/// The group the tests run.
const GROUP: u32 = 7;

/// Small segments and buffered writes: quick on any filesystem.
fn wal_config() -> WalConfig {
    WalConfig {
        segment_bytes: 1 << 20,
        flush_bytes_max: 64 << 10,
        backend: BackendChoice::Portable,
        direct_io: false,
        ..WalConfig::default()
    }
}

/// Node `id`'s replica of `GROUP` with `voters`, on a new log in `dir`.
fn replica(
    dir: &Path,
    id: NodeId,
    voters: Vec<NodeId>,
    host: &ManualHost,
) -> Replica<OsDir, ManualHost> {
    let (wal, report) = Wal::open(dir, wal_config()).expect("open the log");
    let raft = Raft::restore(RaftConfig::new(id, voters), 1, 0, report.restored).expect("raft");
    Replica::new(GROUP, raft, wal, 0, 1 << 20, host.clone())
}

/// Drives until the WAL has nothing left to flush and Raft nothing to
/// say, making every write durable between turns (the disk keeps up).
fn settle(r: &mut Replica<OsDir, ManualHost>, now_ms: u64, out: &mut Vec<Message>) {
    for _ in 0..8 {
        r.drive(now_ms, out);
        r.wal.sync().expect("sync");
    }
    r.drive(now_ms, out);
}

/// A single-voter replica that leads, with `n` entries applied.
fn leader_with(dir: &Path, host: &ManualHost, n: usize) -> Replica<OsDir, ManualHost> {
    let mut r = replica(dir, 1, vec![1], host);
    let mut out = Vec::new();
    r.raft.campaign();
    settle(&mut r, 0, &mut out);
    assert_eq!(r.raft.role(), Role::Leader);
    for i in 0..n {
        r.propose(vec![i as u8; 100], Box::new(|res| assert!(res.is_ok())));
    }
    settle(&mut r, 0, &mut out);
    assert_eq!(r.applied, r.raft.last_index());
    r
}

#[test]
fn an_ack_leaves_only_once_the_entries_it_vouches_for_are_durable() {
    let host = ManualHost::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut r = replica(dir.path(), 2, vec![1, 2, 3], &host);
    let entries: Vec<Entry> = (1..=3)
        .map(|i| Entry {
            term: 1,
            index: i,
            payload: Payload::Normal(vec![i as u8; 100].into()),
        })
        .collect();
    let append = Body::Append {
        prev_index: 0,
        prev_term: 0,
        entries,
        commit: 0,
    };
    r.raft.step(
        0,
        Message {
            from: 1,
            to: 2,
            term: 1,
            body: append,
        },
    );
    let mut out = Vec::new();
    r.drive(0, &mut out);
    // The ack tells the leader 1..=3 are durable here: it is held for the
    // ticket of their write, which the WAL has submitted, not completed
    // (completions are only reaped at the next poll).
    assert!(out.is_empty(), "sent before the log was durable: {out:?}");
    assert_eq!(r.held.len(), 1);
    let ticket = r.held[0].0;
    assert!(r.wal.durable_ticket() < ticket);
    // Each later turn releases it only once that ticket is durable.
    let mut turns = 0;
    while out.is_empty() {
        assert!(r.wal.durable_ticket() < ticket || !r.held.is_empty());
        r.wal.wait().expect("a flush completes"); // the disk's pace, no sleep
        r.drive(0, &mut out);
        turns += 1;
        assert!(turns < 100, "the ack never left");
    }
    assert!(r.wal.durable_ticket() >= ticket);
    assert!(r.wal.durable().0 >= 3);
    assert!(r.held.is_empty());
    let accepted = Body::AppendResponse(AppendResult::Accepted { match_index: 3 });
    assert!(
        matches!(&out[..], [m] if m.to == 1 && m.body == accepted),
        "{out:?}"
    );
}

#[test]
fn a_snapshot_is_adopted_only_once_its_job_ran() {
    let host = ManualHost::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut r = leader_with(dir.path(), &host, 3);
    let mut out = Vec::new();
    let captured = r.applied;
    // Due by time at 500 ms (the phase from seed 0 is 0).
    r.set_snapshot_interval(1_000, 0, 0);
    host.set_now_us(1_000);
    r.drive(499, &mut out);
    assert!(host.queued().is_empty(), "not due yet");
    r.drive(500, &mut out);
    assert_eq!(host.queued(), [format!("quire-snap-g{GROUP}")]);
    // The capture took no time on the host's clock.
    assert_eq!(r.snapshot_stats.last_capture_us, 0);
    // Appends go on while the job waits; nothing is adopted meanwhile.
    r.propose(vec![9; 100], Box::new(|res| assert!(res.is_ok())));
    for now in [600, 700, 800] {
        settle(&mut r, now, &mut out);
        assert!(r.raft.snapshot().is_none());
        assert_eq!(r.snapshot_stats.taken, 0);
        assert_eq!(host.queued().len(), 1);
    }
    host.set_now_us(5_000);
    assert_eq!(host.run_next(), Some(format!("quire-snap-g{GROUP}")));
    r.drive(900, &mut out);
    assert_eq!(r.raft.snapshot().map(|s| s.index), Some(captured));
    assert!(r.wal.durable().0 >= captured);
    assert_eq!(r.snapshot_stats.taken, 1);
    assert_eq!(r.snapshot_stats.last_index, captured);
    // From capture to adoption, on the host's clock.
    assert_eq!(r.snapshot_stats.last_us, 4_000);
}

#[test]
fn a_written_snapshot_waits_for_the_log_to_be_durable_up_to_it() {
    let host = ManualHost::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut r = leader_with(dir.path(), &host, 3);
    let mut out = Vec::new();
    let applied = r.applied;
    // Two more entries, written and submitted, not yet durable: a poll
    // reaps completions before it submits, so one turn cannot finish them.
    r.propose(vec![1; 100], Box::new(|res| assert!(res.is_ok())));
    r.propose(vec![2; 100], Box::new(|res| assert!(res.is_ok())));
    r.drive(0, &mut out);
    assert_eq!(r.wal.durable().0, applied);
    let index: Index = applied + 2;
    assert_eq!(r.raft.last_index(), index);
    // A snapshot a capture made is never above the durable log (Raft
    // hands out for applying only what is durable here), so the guard
    // is given a written one above it directly: it must wait.
    let snap = Snapshot {
        index,
        term: r.raft.term(),
        membership: Membership::with_voters([1]),
        data: Vec::new(),
    };
    crate::storage::write_snapshot_file(&r.wal.free_snapshot_slot(), &snap).expect("slot");
    r.snapshot_written = Some(((snap, 0, None), host.now_us()));
    r.snapshot(0);
    assert!(r.snapshot_written.is_some(), "dropped or adopted early");
    assert!(r.raft.snapshot().is_none());
    assert_eq!(r.snapshot_stats.taken, 0);
    // Once the log is durable up to it, it is adopted: the durability
    // reported (`pump`) commits the entries, the drive applies them and
    // then adopts (a capture is never above the applied index, so the
    // order of those two matters only to this test).
    r.wal.sync().expect("sync");
    r.pump(0, &mut out);
    r.drive(0, &mut out);
    assert_eq!(r.raft.snapshot().map(|s| s.index), Some(index));
    assert_eq!(r.snapshot_stats.taken, 1);
}

#[test]
fn a_produce_records_the_check_of_its_entry_and_an_ack_drops_it() {
    use crate::state::{Command, EntryCheck};
    let host = ManualHost::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut r = leader_with(dir.path(), &host, 0);
    let mut out = Vec::new();
    let mut command = |r: &mut Replica<OsDir, ManualHost>, seq, c: Command| {
        r.propose_command(9, seq, c, 5, Box::new(|o| assert!(o.is_ok(), "{o:?}")));
        settle(r, 0, &mut out);
        r.applied
    };
    let create = Command::CreateQueue {
        name: "q".into(),
        max_deliveries: 3,
    };
    let created = command(&mut r, 1, create);
    let produce = |seq| Command::Produce {
        queue: "q".into(),
        producer_id: 4,
        seq,
        messages: vec![b"m".to_vec()],
    };
    let first = command(&mut r, 2, produce(1));
    let second = command(&mut r, 3, produce(2));
    let entry = |i: Index| r.raft.entry(i).expect("in memory").clone();
    let check_of_entry = |e: Entry| match e.payload {
        Payload::Normal(p) => EntryCheck {
            term: e.term,
            crc: crc32c::crc32c(&p),
        },
        other => panic!("{other:?}"),
    };
    assert_eq!(
        r.machine.check_of(created),
        None,
        "a create refers to nothing"
    );
    assert_eq!(
        r.machine.check_of(first),
        Some(check_of_entry(entry(first)))
    );
    assert_eq!(
        r.machine.check_of(second),
        Some(check_of_entry(entry(second)))
    );
    // A retry of the first produce refers to nothing new.
    let retry = command(&mut r, 2, produce(1));
    assert_eq!(r.machine.check_of(retry), None);
    let ack = Command::Ack {
        queue: "q".into(),
        ids: vec![0],
    };
    command(&mut r, 4, ack);
    assert_eq!(
        r.machine.check_of(first),
        None,
        "acked: nothing refers to it"
    );
    assert!(r.machine.check_of(second).is_some());
}

/// The scrub holds its rate even where one batch is larger than a
/// second's worth (a read of one batch leaves the budget in debt), and
/// still goes through the whole log pass after pass.
#[test]
fn the_scrub_holds_its_rate_when_a_batch_outweighs_a_second_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let host = ManualHost::default();
    let mut r = leader_with(dir.path(), &host, 0);
    let mut out = Vec::new();
    // 40 entries of 3,000 bytes, each flushed alone: 40 batches, each
    // about three seconds of the rate.
    for i in 0..40u8 {
        r.propose(vec![i; 3000], Box::new(|res| assert!(res.is_ok())));
        settle(&mut r, 0, &mut out);
    }
    let rate: u64 = 1024;
    r.set_scrub_rate(rate);
    let secs = 60;
    for ms in 0..=secs * 1000 {
        r.drive(ms, &mut out);
        while host.run_next().is_some() {}
        out.clear();
    }
    let s = r.scrub_stats();
    let batch_max = 8 << 10; // one entry of 3,000 bytes, padded
    assert!(
        s.bytes_verified <= rate * secs + batch_max,
        "{} bytes read in {secs} s at {rate} B/s",
        s.bytes_verified
    );
    assert!(s.bytes_verified >= rate * secs / 2, "{s:?}");
    assert!(s.batches_verified > 0, "{s:?}");
}

/// What the step-down tests' clients heard: one line per answer.
type Heard = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// Node 1 of a three-voter group, just elected for term 1 by node 2's
/// vote (no pre-vote, so one round) and not driven since, with its tap
/// on; no follower ever acks, so nothing it proposes commits.
fn elected_of_three(dir: &Path, host: &ManualHost) -> Replica<OsDir, ManualHost> {
    let (wal, report) = Wal::open(dir, wal_config()).expect("open the log");
    let mut cfg = RaftConfig::new(1, vec![1, 2, 3]);
    cfg.pre_vote = false;
    let raft = Raft::restore(cfg, 1, 0, report.restored).expect("raft");
    let mut r = Replica::new(GROUP, raft, wal, 0, 1 << 20, host.clone());
    r.tap = Some(Vec::new());
    let mut out = Vec::new();
    r.raft.campaign();
    settle(&mut r, 0, &mut out);
    let grant = Body::VoteResponse { granted: true };
    r.raft.step(
        0,
        Message {
            from: 2,
            to: 1,
            term: 1,
            body: grant,
        },
    );
    assert_eq!(r.raft.role(), Role::Leader);
    r
}

/// `elected_of_three`, driven once it leads.
fn leader_of_three(dir: &Path, host: &ManualHost) -> Replica<OsDir, ManualHost> {
    let mut r = elected_of_three(dir, host);
    settle(&mut r, 0, &mut Vec::new());
    r
}

/// Gives `r` requests to hold: three client appends, a state command and
/// a linearizable read, each answer written to `heard`.
fn hold_requests(r: &mut Replica<OsDir, ManualHost>, heard: &Heard) {
    for seq in 1..=3u64 {
        let h = heard.clone();
        let reply = move |res: Result<u64, super::ProposeError>| {
            h.lock().unwrap().push(format!("append {seq}: {res:?}"));
        };
        r.propose_client(9, seq, b"payload", Box::new(reply));
    }
    let h = heard.clone();
    let command = crate::state::Command::CreateQueue {
        name: "q".into(),
        max_deliveries: 3,
    };
    r.propose_command(
        9,
        4,
        command,
        0,
        Box::new(move |res| {
            h.lock().unwrap().push(format!("command: {:?}", res.err()));
        }),
    );
    let h = heard.clone();
    r.read_log(
        1,
        10,
        1 << 20,
        0,
        Box::new(move |res| {
            h.lock().unwrap().push(format!("read: {:?}", res.err()));
        }),
    );
    let mut out = Vec::new();
    settle(r, 0, &mut out);
    assert!(
        heard.lock().unwrap().is_empty(),
        "answered while leading: {heard:?}"
    );
    assert_eq!(r.requests_held(), 3);
}

/// The step-down notes `r`'s tap took.
fn step_downs(r: &mut Replica<OsDir, ManualHost>) -> Vec<(u64, u64)> {
    let notes = std::mem::take(r.tap.as_mut().expect("tap on"));
    notes
        .into_iter()
        .filter_map(|n| match n {
            super::tap::Note::SteppedDown { term, answered } => Some((term, answered)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_leader_cut_off_from_its_majority_answers_what_it_holds_as_it_steps_down() {
    let host = ManualHost::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut r = leader_of_three(dir.path(), &host);
    let heard = Heard::default();
    hold_requests(&mut r, &heard);
    step_downs(&mut r);
    // No follower answers: check-quorum steps it down after an election
    // timeout. Each tick is followed by a drive, as on the loop.
    let mut out = Vec::new();
    let mut now = 0;
    while r.raft.role() == Role::Leader {
        now += 10;
        assert!(now < 10_000, "it never stepped down");
        r.raft.tick(now);
        r.drive(now, &mut out);
    }
    // Answered in the drive of the turn it stopped leading, at the node
    // time it did: no request waits on an old leader.
    let heard = heard.lock().unwrap().clone();
    assert_eq!(heard.len(), 5, "{heard:?}");
    for h in &heard {
        assert!(
            h.contains("SteppedDown(None)") || h.contains("NotLeader(None)"),
            "{h}"
        );
    }
    assert_eq!(step_downs(&mut r), [(1, 5)]);
    assert_eq!(r.step_down_answers, 5);
    assert_eq!(r.requests_held(), 0);
}

#[test]
fn a_leadership_transfer_sends_the_clients_to_the_new_leader_and_answers_the_operator() {
    let host = ManualHost::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut r = leader_of_three(dir.path(), &host);
    let heard = Heard::default();
    hold_requests(&mut r, &heard);
    let operator = Heard::default();
    let o = operator.clone();
    r.transfer_leadership(
        2,
        Box::new(move |res| o.lock().unwrap().push(format!("{res:?}"))),
    );
    let mut out = Vec::new();
    r.drive(1, &mut out);
    assert!(
        operator.lock().unwrap().is_empty(),
        "answered before node 2 took over"
    );
    // Node 2 campaigns at once (TimeoutNow), in term 2: node 1 follows it
    // before it knows who won.
    let vote = Body::Vote {
        last_index: r.raft.last_index(),
        last_term: 1,
        transfer: true,
    };
    r.raft.step(
        2,
        Message {
            from: 2,
            to: 1,
            term: 2,
            body: vote,
        },
    );
    r.drive(2, &mut out);
    assert_ne!(r.raft.role(), Role::Leader);
    let answers = heard.lock().unwrap().clone();
    assert_eq!(answers.len(), 5, "{answers:?}");
    for h in &answers {
        // The clients go to the transfer's target at once.
        assert!(
            h.contains("SteppedDown(Some(2))") || h.contains("NotLeader(Some(2))"),
            "{h}"
        );
    }
    assert!(
        operator.lock().unwrap().is_empty(),
        "no leader heard from yet"
    );
    // Node 2's first append as leader: the operator hears it leads term 2.
    let append = Body::Append {
        prev_index: 0,
        prev_term: 0,
        entries: Vec::new(),
        commit: 0,
    };
    r.raft.step(
        3,
        Message {
            from: 2,
            to: 1,
            term: 2,
            body: append,
        },
    );
    r.drive(3, &mut out);
    assert_eq!(operator.lock().unwrap().clone(), ["Ok(2)"]);
}

#[test]
fn a_new_leader_keeps_what_it_took_before_its_first_drive() {
    // On the loop, a vote that elects a node and the client requests of
    // the same turn come before its drive: they are its own, kept.
    let host = ManualHost::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut r = elected_of_three(dir.path(), &host);
    let heard = Heard::default();
    hold_requests(&mut r, &heard);
    assert!(step_downs(&mut r).is_empty());
    assert_eq!(r.step_down_answers, 0);
}
