//! Ledger and queue workloads that run through the fault schedule next to
//! the append workload, recording what the checks need:
//!
//! - a ledger writer adds entries to its ledger while, every few seconds,
//!   another client opens the ledger with recovery (fencing the writer);
//!   the writer then starts a new ledger. Recorded: each add's send time,
//!   completion and outcome, and each fence's completion time and sealed
//!   metadata.
//! - a queue producer produces one message at a time; a consumer pulls,
//!   and acks what it got. Recorded: every confirmed produce (its id),
//!   every delivery (id, when the consume was sent), every ack with its
//!   outcome and completion time.
//!
//! The checks on these records are in `check.rs` (`ledger_fencing`,
//! `queue_redelivery`).

use quire::api::ErrorCode;
use quire::client::{Client, ClientError, LedgerWriter};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One add to a ledger.
#[derive(Clone, Debug)]
pub struct Add {
    /// The writer's count of adds to this ledger (from 0).
    pub k: u64,
    /// The data.
    pub data: Vec<u8>,
    /// When it was sent.
    pub sent: Instant,
    /// Its entry id if confirmed; Err("fenced") if refused as fenced;
    /// Err(other) if failed or unknown.
    pub outcome: Result<u64, String>,
}

/// One ledger of the run: its adds and how it was fenced.
#[derive(Clone, Debug, Default)]
pub struct LedgerRun {
    /// The ledger id.
    pub id: u64,
    /// Every add, in order.
    pub adds: Vec<Add>,
    /// When the open with recovery returned, and the sealed length.
    pub fenced: Option<(Instant, u64)>,
    /// The sealed ledger read back after the run: (entry id, data).
    pub read_back: Vec<(u64, Vec<u8>)>,
}

/// The queue's records.
#[derive(Clone, Debug, Default)]
pub struct QueueRun {
    /// Ids of confirmed produces, with their data.
    pub produced: Vec<(u64, Vec<u8>)>,
    /// Every delivery: id, and when the consume that got it was sent.
    pub delivered: Vec<(u64, Instant)>,
    /// Every confirmed ack: ids, and when it completed.
    pub acked: Vec<(Vec<u64>, Instant)>,
}

const GROUP: u32 = 0;
const QUEUE: &str = "faults";

/// The ledger and queue clients, running until stopped.
pub struct StateWorkload {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    ledgers: Arc<Mutex<Vec<LedgerRun>>>,
    queue: Arc<Mutex<QueueRun>>,
}

impl StateWorkload {
    /// Starts the writer, the fencer, the producer and the consumer
    /// (client ids 500..504); each call gives up after `deadline` (its
    /// outcome unknown); the fencer fences the current ledger every
    /// `fence_every`.
    pub fn start(
        cluster: &super::cluster::Cluster,
        deadline: Duration,
        fence_every: Duration,
    ) -> StateWorkload {
        let stop = Arc::new(AtomicBool::new(false));
        let ledgers: Arc<Mutex<Vec<LedgerRun>>> = Arc::default();
        let queue: Arc<Mutex<QueueRun>> = Arc::default();
        let mut setup = cluster.client(504, Duration::from_secs(30));
        setup
            .queue_create(
                GROUP,
                QUEUE,
                quire::state::queue::DELIVERIES_PER_MESSAGE_MAX,
            )
            .expect("the queue is created");
        let mut threads = Vec::new();
        // The writer: one ledger after another, each until it is fenced.
        let current: Arc<Mutex<Option<u64>>> = Arc::default();
        {
            let (mut c, stop, ledgers, current) = (
                cluster.client(500, deadline),
                Arc::clone(&stop),
                Arc::clone(&ledgers),
                Arc::clone(&current),
            );
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(w) = c.ledger_create(GROUP) else {
                        continue;
                    };
                    let slot = {
                        let mut ls = ledgers.lock().unwrap();
                        ls.push(LedgerRun {
                            id: w.id,
                            ..LedgerRun::default()
                        });
                        ls.len() - 1
                    };
                    *current.lock().unwrap() = Some(w.id);
                    write_until_fenced(&mut c, w, slot, &ledgers, &stop);
                }
            }));
        }
        // The fencer: opens the current ledger with recovery now and then.
        {
            let (mut c, stop, ledgers, current) = (
                cluster.client(501, deadline),
                Arc::clone(&stop),
                Arc::clone(&ledgers),
                Arc::clone(&current),
            );
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(fence_every); // pacing the fences
                    let Some(id) = current.lock().unwrap().take() else {
                        continue;
                    };
                    fence(&mut c, id, &ledgers);
                }
            }));
        }
        // The producer.
        {
            let (mut c, stop, queue) = (
                cluster.client(502, deadline),
                Arc::clone(&stop),
                Arc::clone(&queue),
            );
            threads.push(std::thread::spawn(move || {
                let mut k = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    k += 1;
                    let data = format!("m{k}").into_bytes();
                    if let Ok(ids) = c.produce(GROUP, QUEUE, std::slice::from_ref(&data)) {
                        queue.lock().unwrap().produced.push((ids.start, data));
                    }
                    std::thread::sleep(Duration::from_millis(10)); // pacing
                }
            }));
        }
        // The consumer: pull, then ack what came.
        {
            let (mut c, stop, queue) = (
                cluster.client(503, deadline),
                Arc::clone(&stop),
                Arc::clone(&queue),
            );
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    consume_and_ack(&mut c, &queue, 1000);
                    std::thread::sleep(Duration::from_millis(10)); // pacing
                }
            }));
        }
        StateWorkload {
            stop,
            threads,
            ledgers,
            queue,
        }
    }

    /// Stops the clients, fences the last ledger, reads every ledger back
    /// and drains the queue (consuming and acking until nothing is left);
    /// returns the records.
    pub fn finish(self, cluster: &super::cluster::Cluster) -> (Vec<LedgerRun>, QueueRun) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("a state workload thread");
        }
        let mut c = cluster.client(505, Duration::from_secs(30));
        let ids: Vec<u64> = self.ledgers.lock().unwrap().iter().map(|l| l.id).collect();
        for id in ids {
            if self
                .ledgers
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.id == id && l.fenced.is_none())
            {
                fence(&mut c, id, &self.ledgers);
            }
            let len = self
                .ledgers
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.id == id)
                .and_then(|l| l.fenced.map(|f| f.1))
                .unwrap_or(0);
            let mut read = Vec::new();
            while (read.len() as u64) < len {
                let page = c
                    .ledger_read(GROUP, id, read.len() as u64, len - 1)
                    .expect("a sealed ledger reads back");
                assert!(
                    !page.is_empty(),
                    "ledger {id} reads short of its length {len}"
                );
                read.extend(page);
            }
            let mut ls = self.ledgers.lock().unwrap();
            ls.iter_mut().find(|l| l.id == id).unwrap().read_back = read;
        }
        // Drain: unacked messages come back after their visibility; once
        // no pull has returned anything for longer than that, it is empty.
        let mut quiet_since = Instant::now();
        while quiet_since.elapsed() < Duration::from_millis(1500) {
            if consume_and_ack(&mut c, &self.queue, 500) > 0 {
                quiet_since = Instant::now();
            }
        }
        let ledgers = self.ledgers.lock().unwrap().clone();
        let queue = self.queue.lock().unwrap().clone();
        (ledgers, queue)
    }
}

/// Adds to ledger `w` until the writer is fenced or stopped.
fn write_until_fenced(
    c: &mut Client,
    w: LedgerWriter,
    slot: usize,
    ledgers: &Mutex<Vec<LedgerRun>>,
    stop: &AtomicBool,
) {
    for k in 0u64.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let data = format!("l{}-e{k}", w.id).into_bytes();
        let sent = Instant::now();
        let r = c.ledger_append(GROUP, w, &data);
        let fenced = matches!(&r, Err(ClientError::Refused(ErrorCode::Fenced, _)));
        let outcome = match r {
            Ok(id) => Ok(id),
            Err(_) if fenced => Err("fenced".to_string()),
            Err(e) => Err(e.to_string()),
        };
        ledgers.lock().unwrap()[slot].adds.push(Add {
            k,
            data,
            sent,
            outcome,
        });
        if fenced {
            return;
        }
        std::thread::sleep(Duration::from_millis(10)); // pacing
    }
}

/// Opens ledger `id` with recovery (retrying until it answers) and
/// records when that returned and the sealed length.
fn fence(c: &mut Client, id: u64, ledgers: &Mutex<Vec<LedgerRun>>) {
    let started = Instant::now();
    let info = loop {
        match c.ledger_open(GROUP, id, true) {
            Ok(info) => break info,
            Err(e) => assert!(
                started.elapsed() < super::cluster::SERVE_BOUND,
                "ledger {id} cannot be opened with recovery: {e}"
            ),
        }
    };
    let at = Instant::now();
    assert!(info.fenced, "opened with recovery but not fenced: {info:?}");
    let mut ls = ledgers.lock().unwrap();
    if let Some(l) = ls.iter_mut().find(|l| l.id == id) {
        l.fenced = Some((at, info.length));
    }
}

/// One pull and one ack of what it got; returns how many came.
fn consume_and_ack(c: &mut Client, queue: &Mutex<QueueRun>, visibility_ms: u64) -> usize {
    let sent = Instant::now();
    let Ok(ds) = c.consume(GROUP, QUEUE, 16, visibility_ms) else {
        return 0;
    };
    let ids: Vec<u64> = ds.iter().map(|d| d.id).collect();
    queue
        .lock()
        .unwrap()
        .delivered
        .extend(ids.iter().map(|&id| (id, sent)));
    if !ids.is_empty() && c.ack(GROUP, QUEUE, &ids).is_ok() {
        queue
            .lock()
            .unwrap()
            .acked
            .push((ids.clone(), Instant::now()));
    }
    ids.len()
}
