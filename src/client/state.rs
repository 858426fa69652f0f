//! Ledgers and queues from the client: each call is one state-machine
//! command or query sent to the group's leader. Commands carry this
//! client's id and a fresh sequence number, and a retry (after a failover
//! or a lost answer) reuses them, so an add, a create or a close is applied
//! once; a produce is deduplicated by (producer id, seq) instead, which the
//! queue keeps for a window of `PRODUCE_WINDOW` batches per producer.

use super::{Client, ClientError};
use crate::api::{Request, Response};
use crate::state::ledger::LedgerInfo;
use crate::state::queue::Delivery;
use crate::state::queue::QueueInfo;
use crate::state::{Answer, Command, Outcome, Query};
use std::ops::Range;

/// Longest wait of one long-poll request, below the socket read timeout
/// (a longer wait is several requests).
const LONG_POLL_MS_MAX: u32 = 1500;

/// A ledger this client created and writes: its id and writer token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LedgerWriter {
    /// The ledger's id.
    pub id: u64,
    /// The writer's token: whoever holds it may add entries.
    pub token: u64,
}

fn unexpected(what: &str, resp: impl std::fmt::Debug) -> ClientError {
    ClientError::Unavailable(format!("unexpected answer to {what}: {resp:?}"))
}

impl Client {
    /// Runs a command on `group`'s leader and returns its outcome.
    /// `dedup`: send with this client's id and a fresh seq (a retry is
    /// applied once); false for a command that deduplicates itself.
    fn command(
        &mut self,
        group: u32,
        command: &Command,
        dedup: bool,
    ) -> Result<Outcome, ClientError> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let req = Request::Command {
            group,
            client_id: if dedup { self.client_id } else { 0 },
            seq,
            command: command.encode(),
        };
        match self.with_leader(group, req)? {
            Response::Outcome { outcome } => Outcome::decode(&outcome)
                .ok_or_else(|| unexpected("a command", "bytes that do not decode")),
            other => Err(unexpected("a command", other)),
        }
    }

    /// Runs a query on `group`'s leader (linearizable); a ledger read
    /// waits up to `wait_ms` for entries.
    fn query(&mut self, group: u32, query: &Query, wait_ms: u32) -> Result<Answer, ClientError> {
        let req = Request::Query {
            group,
            wait_ms,
            query: query.encode(),
        };
        match self.with_leader(group, req)? {
            Response::Answer { answer } => Answer::decode(&answer)
                .ok_or_else(|| unexpected("a query", "bytes that do not decode")),
            other => Err(unexpected("a query", other)),
        }
    }

    /// Creates a ledger in `group`, written by this client: its id and a
    /// fresh writer token.
    pub fn ledger_create(&mut self, group: u32) -> Result<LedgerWriter, ClientError> {
        // The writer token fences: a guessable or colliding one would let
        // another writer append, so it comes from the kernel's source.
        let token = super::os_random_u64()
            .map_err(|e| ClientError::Unavailable(format!("a writer token: {e}")))?
            | 1;
        let cmd = Command::CreateLedger {
            writer_token: token,
            now_ms: 0, // the leader stamps its clock
        };
        match self.command(group, &cmd, true)? {
            Outcome::LedgerCreated(id) => Ok(LedgerWriter { id, token }),
            other => Err(unexpected("create", other)),
        }
    }

    /// Adds an entry to a ledger this writer holds; returns its entry id
    /// once it is durable on a majority. `Refused(Fenced, ..)` once the
    /// ledger was opened with recovery.
    pub fn ledger_append(
        &mut self,
        group: u32,
        writer: LedgerWriter,
        data: &[u8],
    ) -> Result<u64, ClientError> {
        let cmd = Command::AddEntry {
            ledger: writer.id,
            writer_token: writer.token,
            data: data.to_vec(),
        };
        match self.command(group, &cmd, true)? {
            Outcome::EntryAdded(id) => Ok(id),
            other => Err(unexpected("append", other)),
        }
    }

    /// Advances the ledger's LAC to `lac` without a new entry (explicit
    /// LAC); returns the LAC after it.
    pub fn ledger_set_lac(
        &mut self,
        group: u32,
        writer: LedgerWriter,
        lac: u64,
    ) -> Result<u64, ClientError> {
        let cmd = Command::SetLac {
            ledger: writer.id,
            writer_token: writer.token,
            lac,
        };
        match self.command(group, &cmd, true)? {
            Outcome::Lac(lac) => Ok(lac),
            other => Err(unexpected("set LAC", other)),
        }
    }

    /// Closes a ledger by its writer; returns the sealed last entry id.
    pub fn ledger_close(
        &mut self,
        group: u32,
        writer: LedgerWriter,
    ) -> Result<Option<u64>, ClientError> {
        let cmd = Command::CloseLedger {
            ledger: writer.id,
            writer_token: writer.token,
        };
        match self.command(group, &cmd, true)? {
            Outcome::Sealed(last) => Ok(last),
            other => Err(unexpected("close", other)),
        }
    }

    /// Opens a ledger to read it. With `recover`, fences its writer and
    /// seals it first (its later appends fail with Fenced): the returned
    /// metadata then names the sealed last entry. Without, a read-only
    /// view of an open ledger (read up to its LAC, or `ledger_tail`).
    pub fn ledger_open(
        &mut self,
        group: u32,
        ledger: u64,
        recover: bool,
    ) -> Result<LedgerInfo, ClientError> {
        if recover {
            match self.command(group, &Command::OpenRecover { ledger }, true)? {
                Outcome::Sealed(_) => {}
                other => return Err(unexpected("open with recovery", other)),
            }
        }
        match self.query(group, &Query::Ledger { ledger }, 0)? {
            Answer::Ledger(info) => Ok(info),
            other => Err(unexpected("open", other)),
        }
    }

    /// Entries `from..=to` of a ledger, cut at its LAC (and at
    /// `READ_ENTRIES_MAX` entries or `READ_BYTES_MAX` bytes: read on from
    /// the last id), as (entry id, data).
    pub fn ledger_read(
        &mut self,
        group: u32,
        ledger: u64,
        from: u64,
        to: u64,
    ) -> Result<Vec<(u64, Vec<u8>)>, ClientError> {
        match self.query(group, &Query::ReadLedger { ledger, from, to }, 0)? {
            Answer::Entries(es) => Ok(pairs(es)),
            other => Err(unexpected("read", other)),
        }
    }

    /// Entries from `from` on, waiting up to `wait_ms` for the LAC to pass
    /// `from` (a long poll; empty if it did not).
    pub fn ledger_tail(
        &mut self,
        group: u32,
        ledger: u64,
        from: u64,
        wait_ms: u32,
    ) -> Result<Vec<(u64, Vec<u8>)>, ClientError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(wait_ms as u64);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let wait = (left.as_millis() as u32).min(LONG_POLL_MS_MAX);
            let q = Query::ReadLedger {
                ledger,
                from,
                to: u64::MAX,
            };
            match self.query(group, &q, wait)? {
                Answer::Entries(es) if !es.is_empty() || left.is_zero() => return Ok(pairs(es)),
                Answer::Entries(_) => {}
                other => return Err(unexpected("tail", other)),
            }
        }
    }

    /// Deletes a ledger.
    pub fn ledger_delete(&mut self, group: u32, ledger: u64) -> Result<(), ClientError> {
        self.command(group, &Command::DeleteLedger { ledger }, true)
            .map(|_| ())
    }

    /// Every ledger of `group` with its metadata.
    pub fn ledger_list(&mut self, group: u32) -> Result<Vec<LedgerInfo>, ClientError> {
        match self.query(group, &Query::ListLedgers, 0)? {
            Answer::Ledgers(ls) => Ok(ls),
            other => Err(unexpected("list", other)),
        }
    }

    /// Creates a queue that dead-letters a message after `max_deliveries`.
    pub fn queue_create(
        &mut self,
        group: u32,
        name: &str,
        max_deliveries: u32,
    ) -> Result<(), ClientError> {
        let cmd = Command::CreateQueue {
            name: name.into(),
            max_deliveries,
        };
        self.command(group, &cmd, true).map(|_| ())
    }

    /// Deletes a queue and its messages.
    pub fn queue_delete(&mut self, group: u32, name: &str) -> Result<(), ClientError> {
        let cmd = Command::DeleteQueue { name: name.into() };
        self.command(group, &cmd, true).map(|_| ())
    }

    /// Every queue of `group` with its metadata.
    pub fn queue_list(&mut self, group: u32) -> Result<Vec<QueueInfo>, ClientError> {
        match self.query(group, &Query::ListQueues, 0)? {
            Answer::Queues(qs) => Ok(qs),
            other => Err(unexpected("list", other)),
        }
    }

    /// Produces a batch; returns the ids given to it once it is durable on
    /// a majority. Idempotent: a retry (this client's id as producer id,
    /// the same seq) returns the first ids and adds nothing.
    pub fn produce(
        &mut self,
        group: u32,
        queue: &str,
        messages: &[Vec<u8>],
    ) -> Result<Range<u64>, ClientError> {
        let cmd = Command::Produce {
            queue: queue.into(),
            producer_id: self.client_id,
            seq: self.next_seq,
            messages: messages.to_vec(),
        };
        match self.command(group, &cmd, false)? {
            Outcome::Produced { ids, .. } => Ok(ids),
            other => Err(unexpected("produce", other)),
        }
    }

    /// Pulls up to `max` messages, hidden from other consumers for
    /// `visibility_ms`; unacked ones come back after it.
    pub fn consume(
        &mut self,
        group: u32,
        queue: &str,
        max: u32,
        visibility_ms: u64,
    ) -> Result<Vec<Delivery>, ClientError> {
        let cmd = Command::Consume {
            queue: queue.into(),
            consumer: self.client_id,
            max,
            visibility_ms,
            now_ms: 0, // the leader stamps its clock
        };
        match self.command(group, &cmd, true)? {
            Outcome::Consumed(ds) => Ok(ds),
            other => Err(unexpected("consume", other)),
        }
    }

    /// Acks messages: they are deleted and never delivered again (the ack
    /// is replicated). Returns how many were newly acked.
    pub fn ack(&mut self, group: u32, queue: &str, ids: &[u64]) -> Result<u64, ClientError> {
        let cmd = Command::Ack {
            queue: queue.into(),
            ids: ids.to_vec(),
        };
        match self.command(group, &cmd, true)? {
            Outcome::Acked(n) => Ok(n),
            other => Err(unexpected("ack", other)),
        }
    }

    /// A queue's dead-lettered messages.
    pub fn dead_letters(&mut self, group: u32, queue: &str) -> Result<Vec<Delivery>, ClientError> {
        let q = Query::DeadLetters {
            queue: queue.into(),
        };
        match self.query(group, &q, 0)? {
            Answer::Deliveries(ds) => Ok(ds),
            other => Err(unexpected("dead letters", other)),
        }
    }
}

/// Entries as (entry id, data).
fn pairs(es: Vec<crate::state::ledger::LedgerEntry>) -> Vec<(u64, Vec<u8>)> {
    es.into_iter().map(|e| (e.id, e.data)).collect()
}
