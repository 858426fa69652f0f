//! Repair of the entries below the snapshot that the state refers to (a
//! ledger entry's bytes, a produce's messages) and that this log lost or
//! found damaged: found at open (`check_stored_entries`), after a
//! snapshot install, or when an answer could not read one back (`cold`).
//! Each goes into `missing`; the replica asks its peers in turn, at most
//! [`REPAIR_INDEXES_MAX`] indexes a request and one request every
//! [`REPAIR_RETRY_MS`], for their committed copies; takes a copy only if
//! its term and CRC32C are the ones the state recorded when it applied
//! the entry ([`EntryCheck`]); stores it durably (`Wal::store_repaired`);
//! and only then serves it (parked answers are filled again).
//!
//! **Leading.** While an entry is missing, this replica would answer
//! reads of it with an error as leader, so it does not lead
//! (`Raft::set_may_lead(false)`: a leader hands over). It still votes:
//! what a vote vouches for is its log above the snapshot, where damage
//! is repaired by Raft itself and `Raft::is_repairing` withholds votes;
//! entries below the snapshot are committed, on a majority, and a
//! leader elected with this vote holds them (its state refers to them
//! too). One exception keeps a group from going leaderless: an entry
//! every other member said it does not hold either is **lost**; it no
//! longer stops this node from leading (the loss is already everyone's),
//! is still asked for, slowly, and raises an alarm. So is an entry whose
//! check the state lacks (a state restored from a snapshot written before
//! checks): it cannot be verified, so it is never repaired
//! (`unverifiable`).
//!
//! **Answering.** A peer answers with its copies of entries it has
//! committed (from Raft's memory, or its log's cache; an entry it must
//! read from disk first is left out and asked again), verified against
//! its own check if its state has one, and lists the indexes it holds no
//! copy of. It never offers an entry above its commit index, which a new
//! leader could still replace.

use super::super::log::{log_info, log_warn};
use super::tap::{Note, WorkloadBug};
use super::Replica;
use crate::consensus::{Body, Entry, Index, Message, NodeId, Payload, REPAIR_INDEXES_MAX};
use crate::node::host::Host;
use crate::node::status::RepairStats;
use crate::state::EntryCheck;
use crate::storage::{CachedRead, LogDir, WalError};
use std::collections::{BTreeMap, BTreeSet};

/// A repair request goes out at most this often (ms): one peer at a time.
pub(crate) const REPAIR_RETRY_MS: u64 = 200;

/// Repair messages from peers handled per turn at most; the rest wait
/// for the next turn (a peer cannot make one turn unbounded).
const REPAIR_INBOX_MAX: usize = 64;

/// What a replica knows of its entries to repair, and what it did.
#[derive(Debug, Default)]
pub(crate) struct Repair {
    /// Referenced entries this log cannot serve.
    missing: BTreeSet<Index>,
    /// Of those, the members that said they hold no (good) copy.
    not_held_by: BTreeMap<Index, BTreeSet<NodeId>>,
    /// Of those, the ones no other member holds either.
    lost: BTreeSet<Index>,
    /// Of those, the ones the state has no check for.
    unverifiable: BTreeSet<Index>,
    /// Repair messages from peers, handled in `drive`.
    inbox: Vec<Message>,
    /// When (node ms) the next request may go, and to which member (an
    /// index into the others, in id order).
    next_ask_ms: u64,
    next_peer: usize,
    /// Counts, for the status.
    pub(crate) stats: RepairStats,
}

impl Repair {
    fn refresh_stats(&mut self) {
        self.stats.missing = self.missing.len() as u64;
        self.stats.lost = self.lost.len() as u64;
        self.stats.unverifiable = self.unverifiable.len() as u64;
    }

    /// True while an entry that could be repaired is missing.
    fn blocks_leading(&self) -> bool {
        self.missing
            .iter()
            .any(|i| !self.lost.contains(i) && !self.unverifiable.contains(i))
    }
}

impl<D: LogDir, H: Host> Replica<D, H> {
    /// Steps a message from a peer: Raft's, or a repair message, kept for
    /// the next `drive` (which answers it).
    pub(crate) fn step(&mut self, now_ms: u64, msg: Message) {
        if msg.body.is_for_the_replica() {
            if self.repair.inbox.len() < REPAIR_INBOX_MAX {
                self.repair.inbox.push(msg);
            }
            return;
        }
        self.raft.step(now_ms, msg);
    }

    /// Marks referenced entries as missing here, to repair.
    pub(super) fn note_missing(&mut self, indexes: impl IntoIterator<Item = Index>) {
        let mut added = Vec::new();
        for i in indexes {
            if self.repair.missing.insert(i) {
                if self.machine.check_of(i).is_none() {
                    self.repair.unverifiable.insert(i);
                }
                added.push(i);
            }
        }
        if let Some(&first) = added.first() {
            log_warn!(
                "group {}: {} log entries the ledgers and queues refer to are unreadable here (the first: {first}); repairing them from a peer (this node does not lead until then)",
                self.group,
                added.len()
            );
            for i in added {
                self.note(|| Note::Missing { index: i });
            }
            self.repair.next_ask_ms = 0;
        }
        self.repair_leadership();
    }

    /// Drops what the state no longer refers to, and says whether this
    /// node may lead.
    fn repair_leadership(&mut self) {
        if !self.repair.missing.is_empty() {
            let oldest = self.machine.oldest_stored().unwrap_or(Index::MAX);
            let r = &mut self.repair;
            let released: Vec<Index> = r.missing.range(..oldest).copied().collect();
            for i in released {
                r.missing.remove(&i);
                r.not_held_by.remove(&i);
                r.lost.remove(&i);
                r.unverifiable.remove(&i);
            }
        }
        self.repair.refresh_stats();
        let may_lead = !self.repair.blocks_leading();
        if may_lead != self.raft.may_lead() {
            if may_lead {
                log_info!(
                    "group {}: every entry to repair is repaired or lost: this node may lead again",
                    self.group
                );
            }
            self.raft.set_may_lead(may_lead);
        }
    }

    /// One turn of repair (from `drive`): answers and takes what peers
    /// sent, and asks the next peer if it is time.
    pub(super) fn drive_repair(&mut self, now_ms: u64, out: &mut Vec<Message>) {
        for msg in std::mem::take(&mut self.repair.inbox) {
            match msg.body {
                Body::RepairRequest { indexes } => {
                    let reply = self.answer_repair(&indexes);
                    out.push(Message {
                        from: self.raft.id(),
                        to: msg.from,
                        term: self.raft.term(),
                        body: reply,
                    });
                }
                Body::RepairEntries { entries, not_held } => {
                    self.take_repair(msg.from, entries, &not_held)
                }
                _ => {}
            }
        }
        if self.repair.missing.is_empty() {
            return;
        }
        self.repair_leadership();
        if now_ms < self.repair.next_ask_ms {
            return;
        }
        let me = self.raft.id();
        let m = self.raft.membership();
        let others: Vec<NodeId> = m
            .voters
            .iter()
            .chain(&m.learners)
            .copied()
            .filter(|&p| p != me)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if others.is_empty() {
            return;
        }
        let to = others[self.repair.next_peer % others.len()];
        self.repair.next_peer = self.repair.next_peer.wrapping_add(1);
        self.repair.next_ask_ms = now_ms + REPAIR_RETRY_MS;
        // What this peer has not said it lacks; unverifiable entries are
        // never taken, so never asked for.
        let r = &self.repair;
        let indexes: Vec<Index> = r
            .missing
            .iter()
            .copied()
            .filter(|i| !r.unverifiable.contains(i))
            .filter(|i| {
                r.not_held_by
                    .get(i)
                    .is_none_or(|s| !s.contains(&to) || r.lost.contains(i))
            })
            .take(REPAIR_INDEXES_MAX)
            .collect();
        if indexes.is_empty() {
            return;
        }
        self.repair.stats.requests += 1;
        out.push(Message {
            from: me,
            to,
            term: self.raft.term(),
            body: Body::RepairRequest { indexes },
        });
    }

    /// This replica's answer to a peer asking for `indexes`.
    fn answer_repair(&mut self, indexes: &[Index]) -> Body {
        let commit = self.raft.commit_index();
        let budget = self.entry_bytes_max;
        let (mut entries, mut not_held) = (Vec::new(), Vec::new());
        let mut bytes = 0;
        for &i in indexes.iter().take(REPAIR_INDEXES_MAX) {
            if i == 0 || i > commit {
                continue; // not decided here: another peer may answer
            }
            if self.repair.missing.contains(&i) {
                not_held.push(i);
                continue;
            }
            let copy = match self.raft.entry(i) {
                Some(e) => Some(e.clone()),
                None if !self.wal.holds(i) => None,
                None => match self.wal.cached(i) {
                    Ok(CachedRead::Entry(e)) => Some(e),
                    Ok(CachedRead::Reading) => continue, // asked again later
                    Err(_) => None,
                },
            };
            // A copy this replica's own state can check must pass.
            let good = copy.filter(|e| self.machine.check_of(i).is_none_or(|c| matches(e, c)));
            let Some(e) = good else {
                not_held.push(i);
                continue;
            };
            let size = e.size_bytes();
            if !entries.is_empty() && bytes + size > budget {
                continue; // the next request gets it
            }
            bytes += size;
            entries.push(e);
        }
        self.repair.stats.served += entries.len() as u64;
        Body::RepairEntries { entries, not_held }
    }

    /// Takes the copies `from` sent: each that the state's check vouches
    /// for is stored durably, then served; the rest are refused.
    fn take_repair(&mut self, from: NodeId, entries: Vec<Entry>, not_held: &[Index]) {
        let unverified = self.planted_workload == Some(WorkloadBug::RepairUnverified);
        let mut good = Vec::new();
        for e in entries {
            if !self.repair.missing.contains(&e.index)
                || good.iter().any(|g: &Entry| g.index >= e.index)
            {
                continue;
            }
            let Some(check) = self.machine.check_of(e.index) else {
                continue;
            };
            if unverified || matches(&e, check) {
                good.push(e);
            } else {
                self.repair.stats.rejected += 1;
                log_warn!(
                    "group {}: node {from}'s copy of log entry {} is not the entry the state recorded (term {} crc {:08x}): refused",
                    self.group,
                    e.index,
                    check.term,
                    check.crc
                );
                self.repair
                    .not_held_by
                    .entry(e.index)
                    .or_default()
                    .insert(from);
            }
        }
        for &i in not_held {
            if self.repair.missing.contains(&i) {
                self.repair.not_held_by.entry(i).or_default().insert(from);
            }
        }
        self.mark_lost();
        if !good.is_empty() {
            match self.wal.store_repaired(&good) {
                Ok(()) => {
                    let n = good.len() as u64;
                    for e in &good {
                        self.repair.missing.remove(&e.index);
                        self.repair.not_held_by.remove(&e.index);
                        self.repair.lost.remove(&e.index);
                    }
                    self.repair.stats.repaired += n;
                    log_info!(
                        "group {}: repaired {n} log entries from node {from} ({} still missing)",
                        self.group,
                        self.repair.missing.len()
                    );
                    self.note(|| Note::Repaired { entries: good });
                    self.refill_cold_waits();
                }
                Err(e @ WalError::Invalid(_)) | Err(e @ WalError::DiskFull) => {
                    log_warn!("group {}: storing repaired entries: {e}", self.group)
                }
                Err(e) => self.stop(format!("{e}")),
            }
        }
        self.repair_leadership();
    }

    /// Entries every other member said it holds no copy of: lost.
    fn mark_lost(&mut self) {
        let me = self.raft.id();
        let m = self.raft.membership();
        let others: BTreeSet<NodeId> = m
            .voters
            .iter()
            .chain(&m.learners)
            .copied()
            .filter(|&p| p != me)
            .collect();
        let r = &mut self.repair;
        let newly: Vec<Index> = r
            .not_held_by
            .iter()
            .filter(|(i, by)| !r.lost.contains(i) && others.is_subset(by))
            .map(|(&i, _)| i)
            .collect();
        for &i in &newly {
            r.lost.insert(i);
        }
        if let Some(first) = newly.first() {
            log_warn!(
                "group {}: {} log entries the state refers to are held by no member (the first: {first}): they are lost; reads of them fail (ALARM)",
                self.group,
                newly.len()
            );
        }
    }

    /// Repair counts, for the status.
    pub(crate) fn repair_stats(&self) -> RepairStats {
        self.repair.stats
    }
}

/// Whether `e` is the entry `check` recorded.
fn matches(e: &Entry, check: EntryCheck) -> bool {
    match &e.payload {
        Payload::Normal(p) => e.term == check.term && crc32c::crc32c(p) == check.crc,
        _ => false,
    }
}
