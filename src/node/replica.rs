//! One group's replica on this node: its Raft core and its log, joined by
//! the `Ready` contract (consensus/mod.rs): write what Ready asks, send its
//! `messages` at once and its `messages_after_persist` only once the WAL
//! reports everything queued before them durable, report durability back
//! with `persisted`, apply what is committed.

use super::handle::ProposeError;
use super::handle::Reply;
use crate::consensus::{Entry, Index, Message, Payload, Raft, Role, Term};
use crate::state::dedup::{decode_client_entry, encode_client_entry, Applied, DedupTable};
use crate::storage::{DiskState, Ticket, Wal, WalError};
use crate::transport::GroupId;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// A client waiting for its entry to be applied.
pub(crate) struct Waiter {
    term: Term,
    reply: Reply,
}

/// One group on this node.
pub(crate) struct Replica {
    pub(crate) group: GroupId,
    pub(crate) raft: Raft,
    pub(crate) wal: Wal,
    /// Messages that leave once the ticket is durable.
    held: VecDeque<(Ticket, Vec<Message>)>,
    /// What was last reported to Raft as persisted.
    reported: (Index, Term),
    /// Applied state: the index and a running hash of applied data.
    pub(crate) applied: Index,
    pub(crate) applied_hash: u64,
    /// Client appends applied, for idempotent retries.
    dedup: DedupTable,
    /// Indexes of client appends the dedup table did not apply (a retry
    /// of an applied append is proposed again, so the log holds it twice):
    /// reads skip them as they skip no-ops, so a record is read once.
    /// Rebuilt by replay after a restart (apply is deterministic) and
    /// pruned below the snapshot (those indexes are no longer readable).
    not_applied: BTreeSet<Index>,
    waiters: BTreeMap<Index, Waiter>,
    /// When (node ms) the WAL last made progress, and since when writes
    /// have been pending without any.
    pub(crate) last_fsync_ms: u64,
    pending_since_ms: Option<u64>,
    last_durable_ticket: Ticket,
    /// Set once the log stopped (EIO): the group is out of service here.
    pub(crate) stopped: Option<String>,
}

impl Replica {
    pub(crate) fn new(group: GroupId, raft: Raft, wal: Wal, now_ms: u64) -> Self {
        let reported = wal.durable();
        Replica {
            group,
            raft,
            wal,
            held: VecDeque::new(),
            reported,
            applied: 0,
            applied_hash: 0,
            dedup: DedupTable::default(),
            not_applied: BTreeSet::new(),
            waiters: BTreeMap::new(),
            last_fsync_ms: now_ms,
            pending_since_ms: None,
            last_durable_ticket: 0,
            stopped: None,
        }
    }

    /// Proposes a client append with its client id and sequence number:
    /// applied once however often it is retried; the reply is the index
    /// it was applied at (the original one for a retry).
    pub(crate) fn propose_client(&mut self, client_id: u64, seq: u64, data: &[u8], reply: Reply) {
        self.propose(encode_client_entry(client_id, seq, data), reply);
    }

    /// Restores the state machine from a snapshot's data: the applied
    /// hash, then the dedup table. False if the data does not decode.
    pub(crate) fn restore_state(&mut self, index: Index, data: &[u8]) -> bool {
        let Some(hash) = data.get(..8) else {
            return false;
        };
        let Some((table, used)) = DedupTable::decode(&data[8..]) else {
            return false;
        };
        if 8 + used != data.len() {
            return false;
        }
        self.applied = index;
        self.applied_hash = u64::from_le_bytes(hash.try_into().expect("8 bytes"));
        self.dedup = table;
        self.not_applied = self.not_applied.split_off(&(index + 1));
        true
    }

    /// The state machine as snapshot data (see `restore_state`).
    fn state_data(&self) -> Vec<u8> {
        let mut out = self.applied_hash.to_le_bytes().to_vec();
        self.dedup.encode(&mut out);
        out
    }

    /// Proposes a membership change; the reply comes once it is applied.
    pub(crate) fn propose_membership(
        &mut self,
        change: crate::consensus::MembershipChange,
        reply: Reply,
    ) {
        if let Some(why) = &self.stopped {
            reply(Err(ProposeError::Unavailable(why.clone())));
            return;
        }
        match self.raft.propose_membership(change) {
            Ok((index, term)) => {
                self.waiters.insert(index, Waiter { term, reply });
            }
            Err(crate::consensus::RaftError::NotLeader { leader }) => {
                reply(Err(ProposeError::NotLeader(leader)));
            }
            Err(e) => reply(Err(ProposeError::Unavailable(e.to_string()))),
        }
    }

    /// Proposes client data; the reply comes once it is applied.
    pub(crate) fn propose(&mut self, data: Vec<u8>, reply: Reply) {
        if let Some(why) = &self.stopped {
            reply(Err(ProposeError::Unavailable(why.clone())));
            return;
        }
        if let Err(WalError::DiskFull) = self.wal.admit() {
            reply(Err(ProposeError::DiskFull));
            return;
        }
        match self.raft.propose(data) {
            Ok((index, term)) => {
                self.waiters.insert(index, Waiter { term, reply });
            }
            Err(crate::consensus::RaftError::NotLeader { leader }) => {
                reply(Err(ProposeError::NotLeader(leader)));
            }
            Err(e) => {
                reply(Err(ProposeError::Unavailable(e.to_string())));
            }
        }
    }

    /// Runs the Ready loop until Raft has nothing to say; `out` collects
    /// the messages to send now.
    pub(crate) fn drive(&mut self, now_ms: u64, out: &mut Vec<Message>) {
        if self.stopped.is_some() {
            return;
        }
        loop {
            let rd = self.raft.ready();
            if rd.is_empty() {
                break;
            }
            out.extend(rd.messages);
            if let Err(e) = self.write(&rd.snapshot, rd.truncate_from, &rd.entries, rd.hard_state) {
                self.stop(format!("{e}"));
                return;
            }
            if !rd.messages_after_persist.is_empty() {
                let ticket = self.wal.current_ticket();
                if self.wal.durable_ticket() >= ticket {
                    out.extend(rd.messages_after_persist);
                } else {
                    self.held.push_back((ticket, rd.messages_after_persist));
                }
            }
            if let Some(s) = &rd.snapshot {
                if !self.restore_state(s.index, &s.data) {
                    let why = format!(
                        "the snapshot at {} from the leader does not decode",
                        s.index
                    );
                    self.stop(why);
                    return;
                }
            }
            for e in rd.committed {
                self.apply(&e);
            }
            if self.applied > self.raft.applied_index() {
                self.raft.applied(self.applied);
            }
            if rd.snapshot_wanted {
                let data = self.state_data();
                if let Ok(snap) = self.raft.compact(self.applied, data) {
                    self.not_applied = self.not_applied.split_off(&(snap.index + 1));
                    if let Err(e) = self.wal.compact(&snap) {
                        self.stop(format!("{e}"));
                        return;
                    }
                }
            }
        }
        self.pump(now_ms, out);
    }

    fn write(
        &mut self,
        snapshot: &Option<crate::consensus::Snapshot>,
        truncate_from: Option<Index>,
        entries: &[Entry],
        hard_state: Option<crate::consensus::HardState>,
    ) -> Result<(), WalError> {
        if let Some(s) = snapshot {
            self.wal.install_snapshot(s)?;
            self.reported = (s.index, s.term);
            self.raft.persisted(s.index, s.term);
        }
        if truncate_from.is_some() || !entries.is_empty() {
            self.wal.append(truncate_from, entries)?;
        }
        if let Some(hs) = hard_state {
            self.wal.set_hard_state(hs)?;
        }
        Ok(())
    }

    fn apply(&mut self, e: &Entry) {
        self.applied = e.index;
        let mut outcome = Ok(e.index);
        if let Payload::Normal(payload) = &e.payload {
            let data = match decode_client_entry(payload) {
                Some((client, seq, data)) => match self.dedup.apply(client, seq, e.index) {
                    Applied::New => Some(data),
                    Applied::Duplicate(at) => {
                        outcome = Ok(at);
                        self.not_applied.insert(e.index);
                        None
                    }
                    Applied::Forgotten => {
                        self.not_applied.insert(e.index);
                        outcome = Err(ProposeError::Unavailable(format!(
                            "client {client} sequence {seq} is older than the dedup window"
                        )));
                        None
                    }
                },
                None => Some(&payload[..]),
            };
            if let Some(d) = data {
                self.applied_hash = fnv(self.applied_hash, d);
            }
        }
        // Everything at or below the applied index is decided: a waiter
        // whose entry was replaced by another term's learns it failed.
        while let Some(entry) = self.waiters.first_entry() {
            if *entry.key() > e.index {
                break;
            }
            let (index, w) = entry.remove_entry();
            let result = if index == e.index && w.term == e.term {
                outcome.clone()
            } else {
                Err(ProposeError::Lost)
            };
            (w.reply)(result);
        }
    }

    /// Submits queued writes, reaps completions, reports durability and
    /// releases held messages into `out`.
    pub(crate) fn pump(&mut self, now_ms: u64, out: &mut Vec<Message>) {
        if self.stopped.is_some() {
            return;
        }
        if let Err(e) = self.wal.poll() {
            if !matches!(e, WalError::DiskFull) {
                self.stop(format!("{e}"));
                return;
            }
        }
        let durable_ticket = self.wal.durable_ticket();
        if durable_ticket != self.last_durable_ticket {
            self.last_durable_ticket = durable_ticket;
            self.last_fsync_ms = now_ms;
        }
        let pending = durable_ticket < self.wal.current_ticket();
        self.pending_since_ms = match (pending, self.pending_since_ms) {
            (false, _) => None,
            (true, None) => Some(now_ms),
            (true, Some(t)) => Some(t),
        };
        let durable = self.wal.durable();
        if durable != self.reported {
            self.reported = durable;
            self.raft.persisted(durable.0, durable.1);
        }
        while self.held.front().is_some_and(|(t, _)| *t <= durable_ticket) {
            out.extend(self.held.pop_front().expect("front exists").1);
        }
    }

    /// True while writes are pending.
    pub(crate) fn writes_pending(&self) -> bool {
        self.pending_since_ms.is_some()
    }

    /// True if writes have been pending for `stall_ms` with no fsync.
    pub(crate) fn disk_stalled(&self, now_ms: u64, stall_ms: u64) -> bool {
        self.pending_since_ms
            .is_some_and(|t| now_ms >= t.max(self.last_fsync_ms) + stall_ms)
    }

    /// The log failed: this group stops on this node, waiting clients
    /// learn it, and it never leads again until restarted.
    fn stop(&mut self, why: String) {
        eprintln!("group {}: log stopped: {why}", self.group);
        if self.raft.role() == Role::Leader {
            self.raft.step_down();
        }
        for (_, w) in std::mem::take(&mut self.waiters) {
            (w.reply)(Err(ProposeError::Unavailable(why.clone())));
        }
        self.held.clear();
        self.stopped = Some(why);
    }

    /// Committed entries from `from` on, at most `max_entries` and about
    /// `max_bytes` (at least one), as (index, term, data): the data of
    /// client appends without their header; no-ops and membership changes
    /// are skipped. Only what is committed is served.
    pub(crate) fn read(
        &mut self,
        from: Index,
        max_entries: usize,
        max_bytes: usize,
    ) -> Result<Vec<(Index, Term, Vec<u8>)>, ProposeError> {
        if let Some(why) = &self.stopped {
            return Err(ProposeError::Unavailable(why.clone()));
        }
        // Up to what is applied, not committed: only apply knows which
        // entries are retries to skip.
        let commit = self.raft.commit_index().min(self.applied);
        let first = self.raft.first_index().max(1);
        if from < first {
            return Err(ProposeError::Unavailable(format!(
                "entries below {first} were compacted into a snapshot"
            )));
        }
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut at = from;
        while at <= commit && out.len() < max_entries && (out.is_empty() || bytes < max_bytes) {
            let hi = commit.min(at + max_entries as u64 - 1);
            let entries = self
                .wal
                .read(at, hi)
                .map_err(|e| ProposeError::Unavailable(format!("reading the log: {e}")))?;
            if entries.is_empty() {
                break;
            }
            for e in entries {
                at = e.index + 1;
                if self.not_applied.contains(&e.index) {
                    continue;
                }
                if let Payload::Normal(p) = e.payload {
                    let data = match decode_client_entry(&p) {
                        Some((_, _, d)) => d.to_vec(),
                        None => p,
                    };
                    bytes += data.len();
                    out.push((e.index, e.term, data));
                    if out.len() >= max_entries || bytes >= max_bytes {
                        break;
                    }
                }
            }
        }
        Ok(out)
    }

    /// The disk state to report.
    pub(crate) fn disk_state(&self) -> String {
        match (&self.stopped, self.wal.state()) {
            (Some(why), _) => format!("failed: {why}"),
            (None, DiskState::Healthy) => "healthy".into(),
            (None, DiskState::Degraded) => "degraded".into(),
            (None, DiskState::Full) => "full".into(),
            (None, DiskState::Failed(why)) => format!("failed: {why}"),
        }
    }
}

/// FNV-1a over `data`, continuing from `h`.
fn fnv(mut h: u64, data: &[u8]) -> u64 {
    if h == 0 {
        h = 0xcbf2_9ce4_8422_2325;
    }
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
