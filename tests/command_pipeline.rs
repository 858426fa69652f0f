//! The pipelined command client (`quire::client::CommandPipeline`) and the
//! queue `Consumer` against three real `quired` daemons on 127.0.0.1
//! (`node::processes`, as `quire up` lays them out):
//!
//! - hundreds of ledger adds in flight on one connection take entry ids
//!   in the order they were sent, and a read gives back each one's bytes
//!   (the leader gathers them into command batch entries);
//! - a SIGKILL of the leader while adds and produces stream loses none of
//!   them and applies each once (retries carry the same client and seq);
//! - a consumer with a prefetch window and batched acks gets every
//!   message produced exactly once, and an acked one never comes back.
//!
//! Nothing sleeps to synchronise: the pipeline's own calls wait on its
//! socket, and reads back poll with a deadline.

mod common;

use quire::client::{
    Client, CommandCompletion, CommandPipeline, Consumer, ConsumerConfig, PipelineConfig,
    SendError, Ticket,
};
use quire::node::local::processes::LocalProcesses;
use quire::state::{Command, Outcome};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Three daemons running one group under `dir`.
fn cluster(dir: &std::path::Path) -> LocalProcesses {
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_quired"));
    let mut c = LocalProcesses::prepare(dir, 3, 1, &exe).expect("cluster prepared");
    c.start_all().expect("daemons start");
    c
}

fn pipeline(c: &LocalProcesses, in_flight_max: usize) -> CommandPipeline {
    let id = quire::client::random_client_id().unwrap();
    let config = PipelineConfig {
        in_flight_max,
        ..PipelineConfig::default()
    };
    CommandPipeline::new(c.client_addrs(), &c.token, id, 0, config)
}

/// A blocking client of `c` whose calls wait out an election.
fn client(c: &LocalProcesses) -> Client {
    let mut client = Client::new(c.client_addrs(), &c.token, 7);
    client.deadline = Duration::from_secs(20);
    client
}

/// Sends `command`, taking outcomes into `out` while the pipeline is full.
fn send(p: &mut CommandPipeline, command: Command, out: &mut Vec<CommandCompletion>) -> Ticket {
    loop {
        match p.send(command.clone()) {
            Ok(t) => return t,
            Err(SendError::Full) => out.extend(p.poll(Duration::from_secs(1))),
            Err(e) => panic!("{e}"),
        }
    }
}

/// Reads back every entry of ledger `id` (`count` of them, once
/// confirmed), polling until they are.
fn ledger_entries(c: &mut Client, id: u64, count: u64) -> Vec<(u64, Vec<u8>)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = Vec::new();
    while (out.len() as u64) < count {
        assert!(
            Instant::now() < deadline,
            "ledger {id}: {} of {count}",
            out.len()
        );
        let from = out.len() as u64;
        out.extend(c.ledger_read(0, id, from, count - 1).unwrap());
    }
    out
}

#[test]
fn pipelined_adds_take_entry_ids_in_the_order_sent() {
    let dir = tempfile::tempdir().unwrap();
    let procs = cluster(dir.path());
    let mut c = client(&procs);
    let writer = c.ledger_create(0).expect("a ledger");
    let mut p = pipeline(&procs, 256);
    let mut out = Vec::new();
    let mut sent = BTreeMap::new();
    for i in 0..3000u64 {
        let data = format!("entry {i}").into_bytes();
        let add = Command::AddEntry {
            ledger: writer.id,
            writer_token: writer.token,
            data: data.clone(),
        };
        sent.insert(send(&mut p, add, &mut out), data);
    }
    out.extend(p.flush());
    assert_eq!(out.len(), sent.len());
    for (k, o) in out.iter().enumerate() {
        assert_eq!(o.ticket, *sent.keys().nth(k).unwrap(), "in the order sent");
        assert_eq!(
            o.result,
            Ok(Outcome::EntryAdded(k as u64)),
            "ids in send order"
        );
    }
    let stats = p.stats();
    assert_eq!(stats.connections_opened, 1, "one connection: {stats:?}");
    // Closed, so the last entry is readable too (the LAC trails by one).
    c.ledger_close(0, writer).unwrap();
    let read = ledger_entries(&mut c, writer.id, sent.len() as u64);
    for ((id, data), want) in read.iter().zip(sent.values()) {
        assert_eq!(data, want, "entry {id}'s bytes");
    }
    // Batched: far fewer log entries than adds.
    let status: serde_json::Value = serde_json::from_str(&c.status(0).unwrap()).unwrap();
    let last = status["groups"][0]["commit"].as_u64().unwrap();
    assert!(last < 1500, "3000 adds in {last} log entries");
}

#[test]
fn a_leader_killed_mid_pipeline_loses_no_command_and_applies_each_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut procs = cluster(dir.path());
    let mut c = client(&procs);
    let writer = c.ledger_create(0).expect("a ledger");
    c.queue_create(0, "q", 1000).expect("a queue");
    let leader = common::agreed_leader(&procs, Duration::from_secs(20));
    let mut p = pipeline(&procs, 128);
    let mut out = Vec::new();
    let mut adds = BTreeMap::new();
    let mut produced = BTreeMap::new();
    let mut killed = None;
    for i in 0..4000u64 {
        let data = format!("c{i}").into_bytes();
        let (command, into) = if i % 2 == 0 {
            let add = Command::AddEntry {
                ledger: writer.id,
                writer_token: writer.token,
                data: data.clone(),
            };
            (add, &mut adds)
        } else {
            let produce = Command::Produce {
                queue: "q".into(),
                producer_id: 0,
                seq: 0,
                messages: vec![data.clone()],
            };
            (produce, &mut produced)
        };
        into.insert(send(&mut p, command, &mut out), data);
        if killed.is_none() && out.len() >= 1000 {
            procs.signal(leader, libc::SIGKILL);
            procs.wait(leader);
            killed = Some((out.len(), p.pending()));
        }
        // Before the kill, waiting a little for outcomes as they come, so
        // the kill falls mid-stream however fast the sends go.
        let wait = if killed.is_none() {
            Duration::from_millis(1)
        } else {
            Duration::ZERO
        };
        out.extend(p.poll(wait));
        out.extend(std::iter::from_fn(|| p.poll(Duration::ZERO)));
    }
    out.extend(p.flush());
    eprintln!("killed at (taken, pending) {killed:?}; {:?}", p.stats());
    let (taken, pending) = killed.expect("the leader was killed");
    assert!(pending > 0, "commands were in flight when the leader died");
    assert!(
        out.len() > taken + 10,
        "commands went on after the failover"
    );
    assert_eq!(out.len(), adds.len() + produced.len());
    let mut entry_ids = BTreeSet::new();
    let mut message_ids = BTreeSet::new();
    for o in &out {
        match o.result.clone().expect("no command lost") {
            Outcome::EntryAdded(id) => assert!(entry_ids.insert(id), "entry {id} twice"),
            Outcome::Produced { ids, .. } => {
                assert_eq!(ids.end - ids.start, 1);
                assert!(message_ids.insert(ids.start), "message {} twice", ids.start);
            }
            other => panic!("{other:?}"),
        }
    }
    // Every add is in the ledger once, with its bytes; nothing else is.
    c.ledger_close(0, writer).unwrap();
    let read = ledger_entries(&mut c, writer.id, adds.len() as u64);
    let got: BTreeSet<&Vec<u8>> = read.iter().map(|(_, d)| d).collect();
    let want: BTreeSet<&Vec<u8>> = adds.values().collect();
    assert_eq!(got, want, "each add applied once");
    let info = c.ledger_open(0, writer.id, false).unwrap();
    assert_eq!(info.length, adds.len() as u64, "no add applied twice");
    // Every produce is in the queue once.
    let mut seen = BTreeSet::new();
    while seen.len() < produced.len() {
        let got = c.consume(0, "q", 1024, 60_000).unwrap();
        assert!(
            !got.is_empty(),
            "{} of {} messages",
            seen.len(),
            produced.len()
        );
        for d in got {
            assert!(seen.insert(d.data), "a message delivered twice");
        }
    }
    assert_eq!(seen, produced.values().cloned().collect());
}

#[test]
fn a_consumer_with_prefetch_gets_every_message_once_and_acks_in_batches() {
    let dir = tempfile::tempdir().unwrap();
    let procs = cluster(dir.path());
    let mut c = client(&procs);
    c.queue_create(0, "q", 1000).expect("a queue");
    let mut p = pipeline(&procs, 64);
    let mut out = Vec::new();
    let total = 5000u64;
    for i in 0..total / 50 {
        let messages = (0..50)
            .map(|k| format!("m{}", i * 50 + k).into_bytes())
            .collect();
        let produce = Command::Produce {
            queue: "q".into(),
            producer_id: 0,
            seq: 0,
            messages,
        };
        send(&mut p, produce, &mut out);
    }
    out.extend(p.flush());
    assert!(
        out.iter().all(|o| o.result.is_ok()),
        "every produce confirmed"
    );
    let config = ConsumerConfig {
        prefetch_max: 200,
        consume_batch_max: 50,
        ack_batch_max: 100,
        visibility_ms: 60_000,
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(pipeline(&procs, 64), "q", config);
    let mut seen = BTreeSet::new();
    while seen.len() < total as usize {
        let d = consumer
            .next(Duration::from_secs(10))
            .unwrap()
            .unwrap_or_else(|| panic!("{} of {total} messages", seen.len()));
        assert!(seen.insert(d.data.clone()), "delivered twice: {:?}", d.data);
        consumer.ack(d.id).unwrap();
    }
    consumer.flush_acks().unwrap();
    consumer.settle(Duration::from_secs(10)).unwrap();
    let stats = consumer.stats();
    assert_eq!(stats.acks_confirmed, total, "{stats:?}");
    assert!(
        stats.ack_batches <= total / 100 + 2,
        "acks in batches: {stats:?}"
    );
    // Acked: nothing comes back, even to a consumer that waits past a
    // short visibility timeout of its own.
    let again = c.consume(0, "q", 1024, 1).unwrap();
    assert!(
        again.is_empty(),
        "acked messages came back: {}",
        again.len()
    );
    assert_eq!(consumer.next(Duration::from_millis(200)).unwrap(), None);
}

/// Commands on one connection apply in the order sent, whatever their
/// kind: a consume sent before a produce to an empty queue finds
/// nothing, though the node answers the consume by mail and the produce
/// by ticket.
#[test]
fn a_consume_sent_before_a_produce_does_not_see_it() {
    let dir = tempfile::tempdir().unwrap();
    let procs = cluster(dir.path());
    let mut c = client(&procs);
    c.queue_create(0, "q", 1000).expect("a queue");
    let mut p = pipeline(&procs, 64);
    // The leader, learnt first, so both go in one write to it.
    let t = p
        .send(Command::Ack {
            queue: "q".into(),
            ids: vec![],
        })
        .unwrap();
    p.wait(t).expect("the leader answers");
    for round in 0..20u64 {
        let consume = Command::Consume {
            queue: "q".into(),
            consumer: 1,
            max: 10,
            visibility_ms: 60_000,
            now_ms: 0,
        };
        let produce = Command::Produce {
            queue: "q".into(),
            producer_id: 0,
            seq: 0,
            messages: vec![format!("m{round}").into_bytes()],
        };
        p.send(consume).unwrap();
        p.send(produce).unwrap();
        let out = p.flush();
        assert_eq!(out.len(), 2);
        match &out[0].result {
            // Each round's message is left unacked and hidden: none shows.
            Ok(Outcome::Consumed(d)) => assert!(d.is_empty(), "round {round}: {d:?}"),
            other => panic!("round {round}: {other:?}"),
        }
        assert!(matches!(out[1].result, Ok(Outcome::Produced { .. })));
        // The next round's consume takes this round's message: consume it
        // here so the queue is empty again.
        let got = c.consume(0, "q", 10, 60_000).unwrap();
        assert_eq!(got.len(), 1, "round {round}");
    }
}
