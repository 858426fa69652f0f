//! A queue consumer with a prefetch window and batched acks, on a
//! [`CommandPipeline`]: it keeps consumes in flight so that up to
//! `prefetch_max` messages are on their way or waiting in it, hands them
//! out one at a time, and acks them in batches of up to `ack_batch_max`
//! ids (one replicated command each), as RabbitMQ consumers with a
//! prefetch count and Kafka fetches do. An acked message is never
//! delivered again; an unacked one comes back after its visibility
//! timeout.
//!
//! A prefetch slot is taken by every message asked for and freed when its
//! ack is sent. A consume the pipeline had to send again (after a
//! failover) is answered by the dedup table with no messages: the ones
//! its first try handed out come back after their visibility timeout.

use super::pipeline::{CommandPipeline, PipelineStats};
use super::{ClientError, SendError, Ticket};
use crate::state::queue::{Delivery, ACK_IDS_MAX, CONSUME_MAX};
use crate::state::{Command, Outcome};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The consumer's knobs; every limit is named with its unit last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerConfig {
    /// Messages asked for, waiting in the consumer or handed out and not
    /// yet acked, at most.
    pub prefetch_max: u32,
    /// Messages one consume asks for at most (within `CONSUME_MAX`).
    pub consume_batch_max: u32,
    /// Consumes in flight at most.
    pub consumes_in_flight_max: usize,
    /// Ids one ack carries at most (within `ACK_IDS_MAX`): a batch goes
    /// out when it is full, or at `flush_acks`.
    pub ack_batch_max: usize,
    /// How long a consumed message stays hidden from other consumers, in
    /// ms: an unacked one comes back after it.
    pub visibility_ms: u64,
}

impl Default for ConsumerConfig {
    fn default() -> ConsumerConfig {
        ConsumerConfig {
            prefetch_max: 256,
            consume_batch_max: 64,
            consumes_in_flight_max: 4,
            ack_batch_max: 64,
            visibility_ms: 30_000,
        }
    }
}

/// What a command of the consumer was.
enum Sent {
    /// A consume asking for this many messages.
    Consume(u32),
    /// An ack of this many ids, sent at this time.
    Ack(u32, Instant),
}

/// The outcome of one ack command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckDone {
    /// How many ids it carried.
    pub ids: u32,
    /// When it was sent.
    pub sent: Instant,
    /// Confirmed (applied on a majority), or why not.
    pub result: Result<(), ClientError>,
}

/// What the consumer did so far; names say what they count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Messages delivered to the consumer.
    pub delivered: u64,
    /// Ids whose ack the cluster confirmed (applied on a majority).
    pub acks_confirmed: u64,
    /// Ack commands sent.
    pub ack_batches: u64,
    /// Consumes answered with no message (the queue was empty).
    pub empty_consumes: u64,
    /// Commands that failed (their error is returned by `next`).
    pub failures: u64,
}

/// A consumer of one queue; see the module docs.
pub struct Consumer {
    pipeline: CommandPipeline,
    queue: String,
    config: ConsumerConfig,
    /// Messages delivered and not yet handed out.
    delivered: VecDeque<Delivery>,
    /// Prefetch slots taken.
    held: u32,
    consumes_in_flight: usize,
    /// Ids acked by the caller and not yet sent.
    to_ack: Vec<u64>,
    /// What each ticket not yet taken back was, in order.
    sent: VecDeque<(Ticket, Sent)>,
    /// Acks with an outcome not yet taken by `take_acks_done`: how many
    /// ids each, when it was sent, and whether it was confirmed.
    acks_done: Vec<AckDone>,
    /// Consumes since the last delivery answered with no message.
    empty_in_a_row: u32,
    stats: ConsumerStats,
}

impl Consumer {
    /// A consumer of `queue` on `pipeline`'s group.
    pub fn new(pipeline: CommandPipeline, queue: &str, config: ConsumerConfig) -> Consumer {
        assert!(config.prefetch_max >= 1, "prefetch_max must be at least 1");
        assert!((1..=CONSUME_MAX).contains(&config.consume_batch_max));
        assert!((1..=ACK_IDS_MAX).contains(&config.ack_batch_max));
        assert!(config.consumes_in_flight_max >= 1);
        Consumer {
            pipeline,
            queue: queue.to_string(),
            config,
            delivered: VecDeque::new(),
            held: 0,
            consumes_in_flight: 0,
            to_ack: Vec::new(),
            sent: VecDeque::new(),
            acks_done: Vec::new(),
            empty_in_a_row: 0,
            stats: ConsumerStats::default(),
        }
    }

    /// What it did so far.
    pub fn stats(&self) -> ConsumerStats {
        self.stats
    }

    /// What its pipeline did so far.
    pub fn pipeline_stats(&self) -> PipelineStats {
        self.pipeline.stats()
    }

    /// Consumes answered with no message since the last delivery: a
    /// caller that sees this grow knows the queue is empty.
    pub fn empty_in_a_row(&self) -> u32 {
        self.empty_in_a_row
    }

    /// The next message, waiting up to `timeout` for one (keeping the
    /// prefetch window full meanwhile); `Ok(None)` if none came.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<Delivery>, ClientError> {
        let until = Instant::now() + timeout;
        loop {
            if let Some(d) = self.delivered.pop_front() {
                return Ok(Some(d));
            }
            self.top_up()?;
            let left = until.saturating_duration_since(Instant::now());
            self.take_one(left)?;
            if self.delivered.is_empty() && Instant::now() >= until {
                return Ok(None);
            }
        }
    }

    /// Acks message `id`: it goes out with the next batch (when
    /// `ack_batch_max` ids wait, or at `flush_acks`).
    pub fn ack(&mut self, id: u64) -> Result<(), ClientError> {
        self.to_ack.push(id);
        if self.to_ack.len() >= self.config.ack_batch_max {
            self.send_acks()?;
        }
        Ok(())
    }

    /// Sends the acks waiting, whatever their number.
    pub fn flush_acks(&mut self) -> Result<(), ClientError> {
        self.send_acks()
    }

    /// The acks with an outcome since the last call, in the order they
    /// were sent (so in the order of the `ack` calls their ids came in).
    pub fn take_acks_done(&mut self) -> Vec<AckDone> {
        std::mem::take(&mut self.acks_done)
    }

    /// Keeps the prefetch window full and takes back one outcome (a
    /// consume's messages, an ack confirmed), waiting up to `timeout`.
    pub fn turn(&mut self, timeout: Duration) -> Result<(), ClientError> {
        self.top_up()?;
        self.take_one(timeout)
    }

    /// Waits until every command sent has its outcome (acks sent first:
    /// call `flush_acks`), up to `timeout`.
    pub fn settle(&mut self, timeout: Duration) -> Result<(), ClientError> {
        let until = Instant::now() + timeout;
        while !self.sent.is_empty() && Instant::now() < until {
            let left = until.saturating_duration_since(Instant::now());
            self.take_one(left)?;
        }
        Ok(())
    }

    /// Sends consumes while the prefetch window has room.
    fn top_up(&mut self) -> Result<(), ClientError> {
        while self.consumes_in_flight < self.config.consumes_in_flight_max {
            let room = self.config.prefetch_max.saturating_sub(self.held);
            let max = room.min(self.config.consume_batch_max);
            if max == 0 {
                break;
            }
            let consume = Command::Consume {
                queue: self.queue.clone(),
                consumer: 0,
                max,
                visibility_ms: self.config.visibility_ms,
                now_ms: 0, // the leader stamps its clock
            };
            let ticket = self.send(consume)?;
            self.sent.push_back((ticket, Sent::Consume(max)));
            self.held += max;
            self.consumes_in_flight += 1;
        }
        Ok(())
    }

    fn send_acks(&mut self) -> Result<(), ClientError> {
        if self.to_ack.is_empty() {
            return Ok(());
        }
        let n = self.to_ack.len() as u32;
        let ack = Command::Ack {
            queue: self.queue.clone(),
            ids: self.to_ack.clone(),
        };
        // The ids stay queued until the ack is sent: `send` may come back
        // with an earlier command's failure first.
        let ticket = self.send(ack)?;
        self.to_ack.clear();
        self.sent.push_back((ticket, Sent::Ack(n, Instant::now())));
        self.held = self.held.saturating_sub(n);
        self.stats.ack_batches += 1;
        Ok(())
    }

    /// Sends `command`, taking outcomes back while the pipeline is full.
    fn send(&mut self, command: Command) -> Result<Ticket, ClientError> {
        loop {
            match self.pipeline.send(command.clone()) {
                Ok(t) => return Ok(t),
                Err(SendError::Full) => self.take_one(Duration::from_millis(50))?,
                Err(e) => return Err(ClientError::Unavailable(e.to_string())),
            }
        }
    }

    /// Takes back one outcome, if one comes within `timeout`.
    fn take_one(&mut self, timeout: Duration) -> Result<(), ClientError> {
        let Some(c) = self.pipeline.poll(timeout) else {
            return Ok(());
        };
        let Some((ticket, what)) = self.sent.pop_front() else {
            return Ok(());
        };
        debug_assert_eq!(ticket, c.ticket, "outcomes come in the order of sends");
        match (what, c.result) {
            (Sent::Consume(asked), Ok(Outcome::Consumed(ds))) => {
                self.consumes_in_flight -= 1;
                // Slots asked for and not filled are free again.
                self.held = self
                    .held
                    .saturating_sub(asked - (ds.len() as u32).min(asked));
                if ds.is_empty() {
                    self.empty_in_a_row += 1;
                    self.stats.empty_consumes += 1;
                } else {
                    self.empty_in_a_row = 0;
                }
                self.stats.delivered += ds.len() as u64;
                self.delivered.extend(ds);
                Ok(())
            }
            (Sent::Ack(n, at), Ok(Outcome::Acked(_))) => {
                self.stats.acks_confirmed += u64::from(n);
                self.acks_done.push(AckDone {
                    ids: n,
                    sent: at,
                    result: Ok(()),
                });
                Ok(())
            }
            // An ack that failed: its ids may or may not be acked (they
            // come back after their visibility timeout if not).
            (Sent::Ack(n, at), result) => {
                self.stats.failures += 1;
                let why = match result {
                    Err(e) => e,
                    Ok(other) => {
                        ClientError::Unavailable(format!("unexpected outcome of an ack: {other:?}"))
                    }
                };
                self.acks_done.push(AckDone {
                    ids: n,
                    sent: at,
                    result: Err(why),
                });
                Ok(())
            }
            (what, result) => {
                if let Sent::Consume(asked) = what {
                    self.consumes_in_flight -= 1;
                    self.held = self.held.saturating_sub(asked);
                }
                self.stats.failures += 1;
                match result {
                    Err(e) => Err(e),
                    Ok(other) => Err(ClientError::Unavailable(format!(
                        "unexpected outcome of a consumer's command: {other:?}"
                    ))),
                }
            }
        }
    }
}
