//! Answers that wait for cold reads. The bytes of a ledger entry or a
//! queue message live in the log entry that carried them; below Raft's
//! snapshot that entry is only in the segments. Reading it back is a cold
//! read on the ring (`Wal::cached`): the loop never waits for the disk,
//! the answer does. It is parked here, with the payloads already read
//! back for it, and filled again each time a cold read finishes.

use super::machine::stored_missing;
use super::tap::MissingFound;
use super::Replica;
use crate::consensus::{Index, Payload, Raft};
use crate::node::command::{ProposeError, QueryReply, StateReply};
use crate::node::log::log_warn;
use crate::node::loops::host::Host;
use crate::state::{Answer, Lookup, Outcome, Unfilled};
use crate::storage::{CachedRead, LogDir, Wal};
use crate::transport::GroupId;
use bytes::Bytes;
use std::collections::BTreeMap;

/// Query answers waiting for cold reads, per group: past it, a query that
/// needs one is refused as busy (retry later). A command's outcome always
/// waits: the command applied, and its waiters are bounded by the
/// proposals in flight.
pub(crate) const COLD_WAITS_MAX: usize = 1024;

/// An answer whose bytes are not all read yet.
pub(super) enum ColdWait {
    /// A query's answer (ledger entries, peeked messages).
    Answer(Answer, QueryReply),
    /// A command's outcome (the messages a consume hands out).
    Outcome(Outcome, StateReply),
}

/// A parked answer and what was read back for it: kept here, not only in
/// the WAL's cache, so an answer that needs more batches than the cache
/// holds still gets them all.
pub(super) struct Parked {
    wait: ColdWait,
    held: BTreeMap<Index, Bytes>,
}

impl<D: LogDir, H: Host> Replica<D, H> {
    /// Answers a query with the bytes it refers to, now or once they are
    /// read back.
    pub(super) fn answer_query(&mut self, answer: Result<Answer, ProposeError>, reply: QueryReply) {
        match answer {
            Ok(a) => self.answer_filled(ColdWait::Answer(a, reply), BTreeMap::new()),
            Err(e) => reply(Err(e)),
        }
    }

    /// Answers a command's waiter with its outcome and the bytes it
    /// refers to, now or once they are read back.
    pub(super) fn answer_outcome(
        &mut self,
        outcome: Result<Outcome, ProposeError>,
        reply: StateReply,
    ) {
        match outcome {
            Ok(o) => self.answer_filled(ColdWait::Outcome(o, reply), BTreeMap::new()),
            Err(e) => reply(Err(e)),
        }
    }

    /// Fills `wait` from `held`, Raft's log and the WAL; answers it, or
    /// parks it while cold reads run.
    fn answer_filled(&mut self, mut wait: ColdWait, mut held: BTreeMap<Index, Bytes>) {
        let group = self.group;
        let mut lookup = |i| lookup_payload(group, &self.raft, &mut self.wal, &mut held, i);
        let filled = match &mut wait {
            ColdWait::Answer(a, _) => a.fill(&mut lookup),
            ColdWait::Outcome(o, _) => o.fill(&mut lookup),
        };
        let failed = match filled {
            Ok(()) => None,
            Err(Unfilled::Missing(i)) => {
                self.snapshot_stats.unreadable_entries += 1;
                if i < self.raft.first_index() {
                    self.note_missing([i], MissingFound::Read, true);
                }
                Some(stored_missing(self.group, i))
            }
            Err(Unfilled::Reading) => {
                let is_query = matches!(wait, ColdWait::Answer(..));
                if !is_query || self.cold_waits.len() < COLD_WAITS_MAX {
                    self.cold_waits.push(Parked { wait, held });
                    return;
                }
                Some(ProposeError::Busy(format!(
                    "group {}: {COLD_WAITS_MAX} answers already wait for reads from disk",
                    self.group
                )))
            }
        };
        match (wait, failed) {
            (ColdWait::Answer(a, reply), None) => reply(Ok(a)),
            (ColdWait::Outcome(o, reply), None) => reply(Ok(o)),
            (ColdWait::Answer(_, reply), Some(e)) => reply(Err(e)),
            (ColdWait::Outcome(_, reply), Some(e)) => reply(Err(e)),
        }
    }

    /// Fills the parked answers again once cold reads finished (call
    /// after `wal.poll`).
    pub(super) fn retry_cold_waits(&mut self) {
        let done = self.wal.cold_reads_done();
        if done == self.cold_reads_seen || self.cold_waits.is_empty() {
            self.cold_reads_seen = done;
            return;
        }
        self.cold_reads_seen = done;
        for p in std::mem::take(&mut self.cold_waits) {
            self.answer_filled(p.wait, p.held);
        }
    }

    /// Fills every parked answer again now (entries were repaired).
    pub(super) fn refill_cold_waits(&mut self) {
        for p in std::mem::take(&mut self.cold_waits) {
            self.answer_filled(p.wait, p.held);
        }
    }

    /// Answers parked for cold reads (for the status).
    pub(crate) fn cold_waits(&self) -> usize {
        self.cold_waits.len()
    }

    /// Fails every parked answer with `why` (the log stopped).
    pub(super) fn fail_cold_waits(&mut self, why: &ProposeError) {
        for p in std::mem::take(&mut self.cold_waits) {
            match p.wait {
                ColdWait::Answer(_, reply) => reply(Err(why.clone())),
                ColdWait::Outcome(_, reply) => reply(Err(why.clone())),
            }
        }
    }
}

/// The payload of the log entry at `i`, for an answer: what was already
/// read back for it (`held`), else Raft's log in memory, else the WAL's
/// read cache, else a cold read started (`Reading`). Never waits.
fn lookup_payload<D: LogDir>(
    group: GroupId,
    raft: &Raft,
    wal: &mut Wal<D>,
    held: &mut BTreeMap<Index, Bytes>,
    i: Index,
) -> Lookup {
    if let Some(p) = held.get(&i) {
        return Lookup::Payload(p.clone());
    }
    let entry = match raft.entry(i) {
        Some(e) => e.clone(),
        None => match wal.cached(i) {
            Ok(CachedRead::Entry(e)) => e,
            Ok(CachedRead::Reading) => return Lookup::Reading,
            Err(e) => {
                log_warn!("group {group}: reading log entry {i} back: {e}");
                return Lookup::Missing;
            }
        },
    };
    match entry.payload {
        Payload::Normal(p) => {
            held.insert(i, p.clone());
            Lookup::Payload(p)
        }
        _ => Lookup::Missing,
    }
}
