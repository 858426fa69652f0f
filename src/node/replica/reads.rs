//! Reads on a replica: linearizable reads of the state machine (queries)
//! and of the raw log go through a read-index round (Raft thesis §6.4),
//! then wait for the applied index to reach the commit index the round
//! saw; stale reads serve what is applied here. What finds nothing yet
//! waits on the loop, with no thread and nothing polled: raw-log tails
//! until an entry is applied, ledger long polls until the LAC moves, each
//! until its deadline.

use super::{refused_by_raft, Replica};
use crate::consensus::{Index, Payload, Term};
use crate::node::command::{ProposeError, QueryReply, ReadReply};
use crate::node::loops::host::Host;
use crate::state::dedup::{address_index, client_records, record_address};
use crate::state::query::command_records;
use crate::state::{Answer, Query};
use crate::storage::LogDir;
use bytes::Bytes;

/// A read waiting for its read-index round (thesis §6.4), then for the
/// applied index to reach the commit index the round saw: a state-machine
/// query, or a read (or tail) of the raw log.
pub(super) enum LinearRead {
    Query {
        query: Query,
        wait_ms: u32,
        reply: QueryReply,
    },
    Log {
        from: Index,
        max_entries: usize,
        max_bytes: usize,
        wait_ms: u32,
        reply: ReadReply,
    },
}

impl LinearRead {
    pub(super) fn fail(self, why: ProposeError) {
        match self {
            LinearRead::Query { reply, .. } => reply(Err(why)),
            LinearRead::Log { reply, .. } => reply(Err(why)),
        }
    }
}

/// A raw-log read that found nothing committed and waits (a tail).
pub(super) struct LogTail {
    /// When the wait ends with an empty answer, in node ms.
    deadline_ms: u64,
    from: Index,
    max_entries: usize,
    max_bytes: usize,
    /// Came through a read-index round on this node as leader: once it
    /// stops leading, the tail is sent on to the new leader
    /// (`answer_lost_leadership`). A stale tail stays on any node.
    linear: bool,
    reply: ReadReply,
}

impl LogTail {
    /// Whether it came through this node's leadership.
    pub(super) fn is_linear(&self) -> bool {
        self.linear
    }

    pub(super) fn fail(self, why: ProposeError) {
        (self.reply)(Err(why));
    }
}

impl<D: LogDir, H: Host> Replica<D, H> {
    /// Answers `query` linearizably: a read-index round confirms this node
    /// still leads, then the query waits until the state has applied
    /// everything committed when it arrived (Raft thesis §6.4). A ledger
    /// read with `wait_ms` that finds nothing past the LAC then waits up
    /// to `wait_ms` for an entry to be confirmed (a long poll): the
    /// entries it gets are committed, so answering from the applied state
    /// as it moves on stays linearizable.
    pub(crate) fn query(&mut self, query: Query, wait_ms: u32, reply: QueryReply) {
        if self.planted_workload == Some(super::tap::WorkloadBug::StaleLac) {
            // Whatever this node has applied, leader or not.
            let answer = self.machine.query(&query).map_err(ProposeError::Refused);
            self.answer_query(answer, reply);
            return;
        }
        self.read_linear(LinearRead::Query {
            query,
            wait_ms,
            reply,
        });
    }

    /// Reads the raw log linearizably (the default for `Read` and `Tail`):
    /// the same read-index round as `query`, then `read_or_wait` once the
    /// applied index reaches the commit index the round saw, so the answer
    /// holds every entry committed before the read arrived. A follower
    /// answers `NotLeader`; `read_or_wait` alone is the stale read.
    /// A tail that then waits is answered with entries as they are applied:
    /// they are committed, so that stays linearizable.
    pub(crate) fn read_log(
        &mut self,
        from: Index,
        max_entries: usize,
        max_bytes: usize,
        wait_ms: u32,
        reply: ReadReply,
    ) {
        self.read_linear(LinearRead::Log {
            from,
            max_entries,
            max_bytes,
            wait_ms,
            reply,
        });
    }

    /// Starts the read-index round of `read`, or refuses it here.
    fn read_linear(&mut self, read: LinearRead) {
        if let Some(why) = &self.stopped {
            read.fail(ProposeError::LogStopped(why.clone()));
            return;
        }
        let id = self.next_read_id;
        self.next_read_id += 1;
        match self.raft.read_index(id) {
            Ok(()) => {
                self.reads_pending.insert(id, read);
            }
            Err(e) => read.fail(refused_by_raft(e)),
        }
    }

    /// Serves the confirmed queries the applied state has caught up with,
    /// and the waiting ledger reads it now has entries for (or whose wait
    /// ended).
    pub(super) fn serve_reads(&mut self, now_ms: u64) {
        while self
            .reads_confirmed
            .front()
            .is_some_and(|(at, _)| *at <= self.applied)
        {
            let (_, read) = self.reads_confirmed.pop_front().expect("front exists");
            let (q, wait_ms, reply) = match read {
                LinearRead::Query {
                    query,
                    wait_ms,
                    reply,
                } => (query, wait_ms, reply),
                LinearRead::Log {
                    from,
                    max_entries,
                    max_bytes,
                    wait_ms,
                    reply,
                } => {
                    let tail = (from, max_entries, max_bytes);
                    self.read_or_wait(tail, wait_ms, now_ms, true, reply);
                    continue;
                }
            };
            let answer = self.machine.query(&q).map_err(ProposeError::Refused);
            if wait_ms > 0 && matches!(&answer, Ok(Answer::Entries(es)) if es.is_empty()) {
                let deadline = now_ms.saturating_add(u64::from(wait_ms));
                self.tails.push((deadline, q, reply));
                continue;
            }
            self.answer_query(answer, reply);
        }
        let mut i = 0;
        while i < self.tails.len() {
            let (deadline, q, _) = &self.tails[i];
            let answer = self.machine.query(q).map_err(ProposeError::Refused);
            let empty = matches!(&answer, Ok(Answer::Entries(es)) if es.is_empty());
            if empty && now_ms < *deadline {
                i += 1;
                continue;
            }
            let (_, _, reply) = self.tails.swap_remove(i);
            self.answer_query(answer, reply);
        }
        // Once this node no longer leads, the unconfirmed reads and the
        // long polls are sent on by `answer_lost_leadership`, in the same
        // `drive`.
    }

    /// Reads waiting: for an entry (ledger reads and raw-log tails), or
    /// for the bytes they carry to be read back from disk.
    pub(crate) fn waiting_reads(&self) -> usize {
        self.tails.len() + self.log_tails.len() + self.cold_waits()
    }

    /// The earliest deadline of a waiting read (node ms), so the loop
    /// wakes for it.
    pub(crate) fn next_tail_deadline(&self) -> Option<u64> {
        let ledger = self.tails.iter().map(|(d, _, _)| *d);
        ledger
            .chain(self.log_tails.iter().map(|t| t.deadline_ms))
            .min()
    }

    /// `read`, except that finding nothing from `from` on, it waits up
    /// to `wait_ms` (node ms from `now_ms`) for an entry to be applied
    /// here, and is answered then (or empty at the end): a tail of the raw
    /// log, with no thread waiting and nothing polled. A stale read: it
    /// waits here whoever leads.
    pub(crate) fn read_or_wait_stale(
        &mut self,
        from: Index,
        max_entries: usize,
        max_bytes: usize,
        wait_ms: u32,
        now_ms: u64,
        reply: ReadReply,
    ) {
        let tail = (from, max_entries, max_bytes);
        self.read_or_wait(tail, wait_ms, now_ms, false, reply);
    }

    /// Answers a read of (from, max entries, max bytes) now if the log has
    /// entries for it (or it may not wait), else parks it as a tail until
    /// it has or `wait_ms` from `now_ms` passed; `linear`: it came through
    /// a read-index round on this node.
    fn read_or_wait(
        &mut self,
        (from, max_entries, max_bytes): (Index, usize, usize),
        wait_ms: u32,
        now_ms: u64,
        linear: bool,
        reply: ReadReply,
    ) {
        match self.read(from, max_entries, max_bytes) {
            Ok(v) if v.is_empty() && wait_ms > 0 => self.log_tails.push(LogTail {
                deadline_ms: now_ms.saturating_add(u64::from(wait_ms)),
                from,
                max_entries,
                max_bytes,
                linear,
                reply,
            }),
            r => reply(r),
        }
    }

    /// Sends on, with `why`, the raw-log tails that came through this
    /// node's leadership (a stale tail stays).
    pub(super) fn fail_linear_log_tails(&mut self, why: &ProposeError) {
        let (linear, stale) = std::mem::take(&mut self.log_tails)
            .into_iter()
            .partition(|t| t.linear);
        self.log_tails = stale;
        for tail in linear {
            LogTail::fail(tail, why.clone());
        }
    }

    /// Answers the waiting raw-log tails that have entries now, or whose
    /// wait ended.
    pub(super) fn serve_log_tails(&mut self, now_ms: u64) {
        let mut i = 0;
        while i < self.log_tails.len() {
            let t = &self.log_tails[i];
            let (deadline, from, max_entries, max_bytes) =
                (t.deadline_ms, t.from, t.max_entries, t.max_bytes);
            let r = self.read(from, max_entries, max_bytes);
            if matches!(&r, Ok(v) if v.is_empty()) && now_ms < deadline {
                i += 1;
                continue;
            }
            (self.log_tails.swap_remove(i).reply)(r);
        }
    }

    /// Whether the read path serves the applied record at `address`: not
    /// a retry the dedup table (or a conflict) kept out.
    pub(crate) fn serves(&self, address: u64) -> bool {
        !self.not_applied.contains(&address)
    }

    /// Committed records from address `from` on, at most `max_records`
    /// and about `max_bytes` (at least one), as (address, term, data):
    /// the records of client appends and raw data; no-ops, membership
    /// changes and ledger or queue commands are skipped. Only what is
    /// committed is served, from Raft's log in memory (it holds every
    /// entry after the snapshot, and nothing below the snapshot is served
    /// here): each record's data is a slice of its entry's payload, no
    /// byte copied and no disk read on the loop.
    pub(crate) fn read(
        &mut self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<(u64, Term, Bytes)>, ProposeError> {
        if let Some(why) = &self.stopped {
            return Err(ProposeError::LogStopped(why.clone()));
        }
        // Up to what is applied, not committed: only apply knows which
        // records are retries to skip.
        let commit = self.raft.commit_index().min(self.applied);
        let first = self.raft.first_index().max(1);
        // Entries below `first` are compacted; a read from an address in
        // one of them is refused (from the start of the log is not).
        if address_index(from) < first && first > 1 {
            return Err(ProposeError::Compacted {
                first: record_address(first, 0),
            });
        }
        let mut out = Vec::new();
        let mut bytes = 0usize;
        // At most `max_records`, and at least one whatever `max_bytes`.
        let full = |records: usize, bytes: usize| {
            records >= max_records || (records > 0 && bytes >= max_bytes)
        };
        let mut at = address_index(from).max(first);
        while at <= commit && !full(out.len(), bytes) {
            let Some(e) = self.raft.entry(at) else {
                // Raft holds every entry from `first` to its last index.
                let why = format!(
                    "group {}: committed entry {at} is not in memory",
                    self.group
                );
                return Err(ProposeError::Unreadable(why));
            };
            at += 1;
            let Payload::Normal(p) = &e.payload else {
                continue;
            };
            if command_records(p).is_some() {
                continue; // a ledger or queue command, not an append
            }
            match client_records(p) {
                Some(records) => {
                    for (slot, (_, _, data)) in records.enumerate() {
                        let address = record_address(e.index, slot);
                        if address < from || !self.serves(address) {
                            continue;
                        }
                        bytes += data.len();
                        out.push((address, e.term, p.slice_ref(data)));
                        if full(out.len(), bytes) {
                            break;
                        }
                    }
                }
                None => {
                    let address = record_address(e.index, 0);
                    if address >= from && self.serves(address) {
                        bytes += p.len();
                        out.push((address, e.term, p.clone()));
                    }
                }
            }
        }
        Ok(out)
    }
}
