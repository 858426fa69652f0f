//! The history the checks judge: every append any client of the suite
//! made, with a unique value naming its client and sequence number, when
//! it was invoked and completed, and how it ended (confirmed at an index,
//! refused for good, or unknown: no answer in time, so it may or may not
//! have been applied). The workload threads that produce it pace
//! themselves and stop on a flag.

use quire::client::{Client, ClientError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How an append ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Confirmed: durable on a majority and applied, at this index.
    Ok(u64),
    /// Refused for good: it must not appear in any log.
    Failed(String),
    /// No answer in time: it may or may not appear (once at most).
    Unknown(String),
}

/// One append.
#[derive(Clone, Debug)]
pub struct Op {
    /// The client that made it.
    pub client: u64,
    /// Its sequence number at that client (from 1).
    pub seq: u64,
    /// The appended bytes (unique in the history).
    pub value: Vec<u8>,
    /// When it was invoked and completed, since the history began.
    pub invoke: Duration,
    /// See `invoke`.
    pub complete: Duration,
    /// How it ended.
    pub outcome: Outcome,
}

/// The shared history of one run.
#[derive(Clone)]
pub struct History {
    /// When the run began: every time in it is measured from here.
    pub t0: Instant,
    ops: Arc<Mutex<Vec<Op>>>,
}

impl History {
    /// An empty history starting now.
    pub fn new() -> History {
        History {
            t0: Instant::now(),
            ops: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Appends `value` through `c` and records the invocation and its
    /// outcome under `client`/`seq`; returns the outcome.
    pub fn append(&self, c: &mut Client, client: u64, seq: u64, value: Vec<u8>) -> Outcome {
        let invoke = self.t0.elapsed();
        let outcome = match c.append(0, &value) {
            Ok(index) => Outcome::Ok(index),
            Err(ClientError::Refused(code, why)) => Outcome::Failed(format!("{code}: {why}")),
            Err(ClientError::Unavailable(why)) => Outcome::Unknown(why),
        };
        let complete = self.t0.elapsed();
        self.ops.lock().unwrap().push(Op {
            client,
            seq,
            value,
            invoke,
            complete,
            outcome: outcome.clone(),
        });
        outcome
    }

    /// A copy of every op so far.
    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }

    /// Confirmed appends completed in `[from, to)` (times since `t0`), per
    /// second.
    pub fn throughput(&self, from: Duration, to: Duration) -> f64 {
        let n = self
            .ops
            .lock()
            .unwrap()
            .iter()
            .filter(|o| matches!(o.outcome, Outcome::Ok(_)))
            .filter(|o| o.complete >= from && o.complete < to)
            .count();
        n as f64 / (to - from).as_secs_f64().max(1e-3)
    }

    /// The highest index any client saw confirmed.
    pub fn max_confirmed_index(&self) -> u64 {
        self.ops
            .lock()
            .unwrap()
            .iter()
            .filter_map(|o| match o.outcome {
                Outcome::Ok(i) => Some(i),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// Counts of (ok, failed, unknown).
    pub fn counts(&self) -> (usize, usize, usize) {
        let ops = self.ops.lock().unwrap();
        let ok = ops
            .iter()
            .filter(|o| matches!(o.outcome, Outcome::Ok(_)))
            .count();
        let failed = ops
            .iter()
            .filter(|o| matches!(o.outcome, Outcome::Failed(_)))
            .count();
        (ok, failed, ops.len() - ok - failed)
    }
}

/// The value of client `client`'s append number `seq`, `pad` bytes long
/// at least (unique: the prefix names client and seq).
pub fn value(client: u64, seq: u64, pad: usize) -> Vec<u8> {
    let mut v = format!("c{client}-s{seq}").into_bytes();
    if v.len() < pad {
        v.push(b'-');
        v.resize(pad, b'x');
    }
    v
}

/// Client threads appending unique values into a history until stopped.
pub struct Workload {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Workload {
    /// Starts `clients` threads, client ids `first_client..`, each with
    /// its own connection; each append gives up (outcome unknown) after
    /// `deadline`, and a client pauses `pace` between appends so that the
    /// daemons keep most of the machine's two cores.
    pub fn start(
        cluster: &super::cluster::Cluster,
        history: &History,
        first_client: u64,
        clients: u64,
        deadline: Duration,
        pace: Duration,
    ) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (first_client..first_client + clients)
            .map(|id| {
                let mut c = cluster.client(id, deadline);
                let h = history.clone();
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut seq = 0;
                    while !stop.load(Ordering::Relaxed) {
                        seq += 1;
                        h.append(&mut c, id, seq, value(id, seq, 0));
                        // Pacing the load, not synchronising.
                        std::thread::sleep(pace);
                    }
                })
            })
            .collect();
        Workload { stop, threads }
    }

    /// Stops every client once its current append has ended.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("a workload thread");
        }
    }
}
