//! The cluster engine's command workloads, pipelined on the job's own
//! thread as appends are: `rw=produce` and `rw=ledger` keep `iodepth`
//! commands in flight on one `client::CommandPipeline` (one connection to
//! the group's leader), and `rw=consume` keeps `iodepth` messages
//! prefetched through a `client::Consumer`, acking each as it is handed
//! out, in batches. An operation of a consume job is one message consumed
//! and its ack confirmed.

use super::engine::{Completion, Op};
use super::error::{BenchError, OpError};
use super::options::{JobOptions, Workload};
use crate::client::{
    ClientError, CommandPipeline, Consumer, ConsumerConfig, LedgerWriter, PipelineConfig, Ticket,
};
use crate::state::queue::{CONSUME_MAX, PRODUCE_MESSAGES_MAX, QUEUE_MESSAGES_MAX};
use crate::state::{Command, Outcome};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Messages a time-based consume job fills per second of its run (ramp
/// included), shared among its clones: above what this host consumes, so
/// a run is not bounded by its fill. A job that consumes them all anyway
/// counts `queue-empty` errors, and says so.
pub const CONSUME_FILL_PER_S: u64 = 250_000;
/// Produces in flight while filling (and the consumer's commands in
/// flight at most).
const FILL_IN_FLIGHT_MAX: usize = 64;
/// Messages per produce while filling.
const FILL_BATCH_MESSAGES: usize = 256;
/// How long a consumed message stays hidden before redelivery; far longer
/// than a consume + ack takes.
const VISIBILITY_MS: u64 = 60_000;
/// Consumes answered empty in a row (with nothing prefetched) after which
/// a waiting operation fails `queue-empty`.
const EMPTY_CONSUMES_DRY: u32 = 3;

/// A pipelined command job.
pub(super) enum Commands {
    /// Produces of one message each, or adds to one ledger.
    Pipelined {
        pipeline: Box<CommandPipeline>,
        /// The command's fixed part: a produce's queue, or the ledger.
        target: Target,
        /// Every message or entry is a prefix of this one buffer.
        payload: Vec<u8>,
        /// The operation behind each ticket, and its bytes.
        ops: HashMap<Ticket, (u64, u64)>,
    },
    /// Consumes and acks.
    Consuming {
        consumer: Box<Consumer>,
        /// Operations waiting for a message, oldest first.
        waiting: VecDeque<(u64, u64)>,
        /// Messages acked, not yet confirmed: (operation, bytes), in the
        /// order of their acks.
        acked: VecDeque<(u64, u64)>,
    },
}

/// What a pipelined job's commands go to.
pub(super) enum Target {
    Queue(String),
    Ledger(LedgerWriter),
}

impl Commands {
    /// The command workload of `job` against the cluster at `addrs`:
    /// creates its queue (filling it for a consume job) or its ledger.
    pub(super) fn open(
        job: &JobOptions,
        target: &super::cluster_engine::ClusterTarget,
        client_id: u64,
    ) -> Result<Commands, BenchError> {
        let config = PipelineConfig {
            in_flight_max: job.in_flight_max.unwrap_or(job.iodepth),
            pending_max: job.iodepth.clamp(1, crate::state::dedup::WINDOW),
            ..PipelineConfig::default()
        };
        let pipeline = |id: u64, config: &PipelineConfig| {
            let p = CommandPipeline::new(
                target.clients.clone(),
                &target.token,
                id,
                job.group,
                config.clone(),
            );
            match &target.tls {
                Some(tls) => p.with_tls(Arc::clone(tls)),
                None => p,
            }
        };
        let payload = vec![0xa5u8; job.bs.max_bytes as usize];
        let mut setup = target.client(client_id ^ 1);
        setup.deadline = Duration::from_secs(10);
        match job.rw {
            Workload::Ledger => {
                let writer = setup
                    .ledger_create(job.group)
                    .map_err(BenchError::client("creating the job's ledger"))?;
                Ok(Commands::Pipelined {
                    pipeline: Box::new(pipeline(client_id, &config)),
                    target: Target::Ledger(writer),
                    payload,
                    ops: HashMap::new(),
                })
            }
            Workload::Produce => {
                create_queue(&mut setup, job)?;
                Ok(Commands::Pipelined {
                    pipeline: Box::new(pipeline(client_id, &config)),
                    target: Target::Queue(job.queue.clone()),
                    payload,
                    ops: HashMap::new(),
                })
            }
            Workload::Consume => {
                create_queue(&mut setup, job)?;
                // The fill and the consumer's few commands (consumes and
                // acks) keep their own bounds, whatever the job's depth.
                let few = PipelineConfig {
                    in_flight_max: FILL_IN_FLIGHT_MAX,
                    pending_max: FILL_IN_FLIGHT_MAX,
                    ..PipelineConfig::default()
                };
                fill(&mut pipeline(client_id ^ 2, &few), job, &payload)?;
                let depth = job.iodepth.min(u32::MAX as usize) as u32;
                let config = ConsumerConfig {
                    prefetch_max: depth,
                    consume_batch_max: (depth / 4).clamp(1, CONSUME_MAX.min(256)),
                    consumes_in_flight_max: 4,
                    ack_batch_max: crate::state::queue::ACK_IDS_MAX,
                    visibility_ms: VISIBILITY_MS,
                };
                let consumer = Consumer::new(pipeline(client_id, &few), &job.queue, config);
                Ok(Commands::Consuming {
                    consumer: Box::new(consumer),
                    waiting: VecDeque::new(),
                    acked: VecDeque::new(),
                })
            }
            other => Err(BenchError::usage(format!(
                "{} is not a command workload",
                super::options::workload_name(other)
            ))),
        }
    }

    /// Takes operation `op`.
    pub(super) fn submit(&mut self, op: Op) -> Result<(), BenchError> {
        match self {
            Commands::Pipelined {
                pipeline,
                target,
                payload,
                ops,
            } => {
                let data = payload[..op.bytes].to_vec();
                let command = match target {
                    Target::Queue(queue) => Command::Produce {
                        queue: queue.clone(),
                        producer_id: 0, // the pipeline numbers it
                        seq: 0,
                        messages: vec![data],
                    },
                    Target::Ledger(w) => Command::AddEntry {
                        ledger: w.id,
                        writer_token: w.token,
                        data,
                    },
                };
                let t = pipeline.send(command).map_err(|source| BenchError::Send {
                    what: "commands",
                    source,
                })?;
                ops.insert(t, (op.id, op.bytes as u64));
                Ok(())
            }
            Commands::Consuming { waiting, .. } => {
                waiting.push_back((op.id, op.bytes as u64));
                Ok(())
            }
        }
    }

    /// Outcomes that come within `timeout`, into `done`.
    pub(super) fn poll(&mut self, timeout: Duration, done: &mut Vec<Completion>) {
        match self {
            Commands::Pipelined { pipeline, ops, .. } => {
                let mut wait = timeout;
                while let Some(c) = pipeline.poll(wait) {
                    wait = Duration::ZERO;
                    let Some((id, bytes)) = ops.remove(&c.ticket) else {
                        continue;
                    };
                    let result = match c.result {
                        Ok(Outcome::Produced { .. } | Outcome::EntryAdded(_)) => Ok(bytes),
                        Ok(other) => Err(OpError::UnexpectedOutcome(Box::new(other))),
                        Err(e) => Err(OpError::Client(e)),
                    };
                    done.push(Completion {
                        id,
                        result,
                        finished: None,
                    });
                }
            }
            Commands::Consuming {
                consumer,
                waiting,
                acked,
            } => consume(consumer, waiting, acked, timeout, done),
        }
    }
}

/// One turn of a consume job: hands a message to each waiting operation
/// (acking it at once), sends the acks, and completes the operations
/// whose acks were confirmed.
fn consume(
    consumer: &mut Consumer,
    waiting: &mut VecDeque<(u64, u64)>,
    acked: &mut VecDeque<(u64, u64)>,
    timeout: Duration,
    done: &mut Vec<Completion>,
) {
    let until = Instant::now() + timeout;
    let fail = |done: &mut Vec<Completion>, id: u64, why: OpError| {
        done.push(Completion {
            id,
            result: Err(why),
            finished: None,
        })
    };
    let mut turned = false;
    loop {
        // What is prefetched goes to the waiting operations, acked at once.
        while !waiting.is_empty() {
            match consumer.next(Duration::ZERO) {
                Ok(Some(d)) => {
                    let (id, _) = waiting.pop_front().expect("checked");
                    match consumer.ack(d.id) {
                        Ok(()) => acked.push_back((id, d.data.len() as u64)),
                        Err(e) => fail(done, id, OpError::Client(e)),
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let (id, _) = waiting.pop_front().expect("checked");
                    fail(done, id, OpError::Client(e));
                }
            }
        }
        // A failure here is a consume's (an ack's comes with its ids,
        // below): it fails an operation still waiting for a message.
        if let Err(e) = consumer.flush_acks() {
            if let Some((id, _)) = waiting.pop_front() {
                fail(done, id, OpError::Client(e));
            }
        }
        for ack in consumer.take_acks_done() {
            for _ in 0..ack.ids {
                let Some((id, bytes)) = acked.pop_front() else {
                    break;
                };
                done.push(Completion {
                    id,
                    result: ack.result.clone().map(|()| bytes).map_err(OpError::Client),
                    finished: None,
                });
            }
        }
        if !waiting.is_empty() && consumer.empty_in_a_row() >= EMPTY_CONSUMES_DRY {
            let (id, _) = waiting.pop_front().expect("checked");
            fail(done, id, OpError::QueueEmpty);
        }
        // At least one turn of I/O per call, even with no time to wait.
        if !done.is_empty() || (turned && Instant::now() >= until) {
            return;
        }
        turned = true;
        // Wait for the next outcome: messages, or an ack confirmed.
        let left = until.saturating_duration_since(Instant::now());
        if let Err(e) = consumer.turn(left) {
            if let Some((id, _)) = waiting.pop_front() {
                fail(done, id, OpError::Client(e));
            }
        }
    }
}

/// Creates `job.queue` (an existing one is reused).
fn create_queue(c: &mut crate::client::Client, job: &JobOptions) -> Result<(), BenchError> {
    match c.queue_create(job.group, &job.queue, 1000) {
        Ok(()) => Ok(()),
        Err(ClientError::Refused(_, why)) if why.contains("exists") => Ok(()),
        Err(e) => Err(BenchError::client(format!(
            "creating queue {:?}",
            job.queue
        ))(e)),
    }
}

/// Fills `job.queue` with this clone's share of what the job consumes:
/// `number_ios`, or `CONSUME_FILL_PER_S` a second of its run.
fn fill(
    pipeline: &mut CommandPipeline,
    job: &JobOptions,
    payload: &[u8],
) -> Result<(), BenchError> {
    let secs = job.runtime.unwrap_or(Duration::from_secs(10)) + job.ramp_time;
    let total = job
        .number_ios
        .unwrap_or((CONSUME_FILL_PER_S as f64 * secs.as_secs_f64()).ceil() as u64)
        .div_ceil(job.numjobs.max(1) as u64)
        .min(QUEUE_MESSAGES_MAX as u64 / 2);
    let batch = FILL_BATCH_MESSAGES.min(PRODUCE_MESSAGES_MAX);
    let mut left = total;
    while left > 0 || pipeline.pending() > 0 {
        if left > 0 && pipeline.pending() < FILL_IN_FLIGHT_MAX {
            let n = left.min(batch as u64);
            let produce = Command::Produce {
                queue: job.queue.clone(),
                producer_id: 0,
                seq: 0,
                messages: vec![payload.to_vec(); n as usize],
            };
            pipeline.send(produce).map_err(|source| BenchError::Send {
                what: "produces",
                source,
            })?;
            left -= n;
            continue;
        }
        if let Some(c) = pipeline.poll(Duration::from_millis(100)) {
            c.result
                .map_err(BenchError::client(format!("filling queue {:?}", job.queue)))?;
        }
    }
    Ok(())
}
