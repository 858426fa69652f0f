//! Repair of the entries below the snapshot that the state refers to (a
//! ledger entry's bytes, a produce's messages) and that this log lost or
//! found damaged: found at open (`check_stored_entries`), after a
//! snapshot install, when an answer could not read one back (`cold`), or
//! by the scrub (`scrub`). Entries nothing refers to in the range a
//! snapshot image carries are repaired too, without a check (their bytes
//! are never served, only carried), so that this node can send images.
//! Each goes into `missing`; the replica asks its peers in turn, at most
//! [`REPAIR_INDEXES_MAX`] indexes a request and one request every
//! [`REPAIR_RETRY_MS`] (doubling per store the log refused in a row, up
//! to 12.8 s), for their committed copies; takes a copy only if
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
//! is still asked for when nothing else is, and raises an alarm. So is an entry whose
//! check the state lacks (a state restored from a snapshot written before
//! checks): it cannot be verified, so it is never repaired
//! (`unverifiable`).
//!
//! **Answering.** A peer answers with its copies of entries it has
//! committed (from Raft's memory, or its log's cache; a request that
//! needs reads from disk waits for them and is answered on a later
//! turn), verified against
//! its own check if its state has one, and lists the indexes it holds no
//! copy of. It never offers an entry above its commit index, which a new
//! leader could still replace.

use super::tap::{MissingFound, Note, WorkloadBug};
use super::Replica;
use crate::consensus::{Body, Entry, Index, Message, NodeId, Payload, REPAIR_INDEXES_MAX};
use crate::node::log::{log_info, log_warn};
use crate::node::loops::host::Host;
use crate::node::status::RepairStats;
use crate::state::EntryCheck;
use crate::storage::{CachedRead, LogDir, WalError};
use std::collections::{BTreeMap, BTreeSet};

/// A repair request goes out at most this often (ms): one peer at a time.
pub(crate) const REPAIR_RETRY_MS: u64 = 200;

/// Times the request interval doubles at most while the log refuses to
/// store repaired copies (disk full, the cap on repaired bytes, or any
/// other refusal):
/// 200 ms up to 12.8 s, so a node that cannot store what it asks for
/// does not pull up to 32 MiB from a peer five times a second.
const REPAIR_STORE_BACKOFF_DOUBLINGS_MAX: u32 = 6;

/// Repair messages from peers kept for the next turn at most; more are
/// dropped (their senders ask again): a peer cannot make a turn, or the
/// memory it holds, unbounded.
const REPAIR_INBOX_MAX: usize = 64;

/// Bytes of repair answers (entries) kept for the next turn at most.
const REPAIR_INBOX_BYTES_MAX: usize = 32 << 20;

/// Entries nothing refers to that a full check looks for at most (in the
/// range a snapshot image carries): more than this is a log to replace.
pub(crate) const REPAIR_GAPS_MAX: usize = 65_536;

/// Peers whose requests wait for cold reads, at most.
const REPAIR_DEFERRED_MAX: usize = 16;

/// What a replica knows of its entries to repair, and what it did.
#[derive(Debug, Default)]
pub(crate) struct Repair {
    /// Entries below the snapshot this log cannot serve and must.
    missing: BTreeSet<Index>,
    /// Of those, the members that said they hold no (good) copy.
    not_held_by: BTreeMap<Index, BTreeSet<NodeId>>,
    /// Of those, the ones no other member holds either.
    lost: BTreeSet<Index>,
    /// Of those, the ones the state has no check for.
    unverifiable: BTreeSet<Index>,
    /// Of those, the ones the state does not refer to, wanted only so
    /// that a snapshot image (which carries a whole range) can be built.
    unreferenced: BTreeSet<Index>,
    /// Repair messages from peers, handled in `drive`, and the bytes of
    /// the entries they carry.
    inbox: Vec<Message>,
    inbox_bytes: usize,
    /// Requests waiting for cold reads, by asker: answered on a later turn.
    deferred: BTreeMap<NodeId, Vec<Index>>,
    /// When (node ms) the next request may go, and to which member (an
    /// index into the others, in id order).
    next_ask_ms: u64,
    next_peer: usize,
    /// Stores of repaired copies the log refused in a row: the request
    /// interval doubles with each, back to [`REPAIR_RETRY_MS`] once one
    /// is stored.
    store_refusals_in_a_row: u32,
    /// Counts, for the status.
    pub(crate) stats: RepairStats,
}

impl Repair {
    fn refresh_stats(&mut self) {
        self.stats.missing = self.missing.len() as u64;
        self.stats.lost = self.lost.len() as u64;
        self.stats.unverifiable = self.unverifiable.len() as u64;
    }

    /// Forgets entry `i`: held again, or no longer referenced.
    fn forget(&mut self, i: Index) {
        self.missing.remove(&i);
        self.not_held_by.remove(&i);
        self.lost.remove(&i);
        self.unverifiable.remove(&i);
        self.unreferenced.remove(&i);
    }

    /// How long after a request the next may go (ms): [`REPAIR_RETRY_MS`],
    /// doubled for each store refused in a row, up to
    /// [`REPAIR_STORE_BACKOFF_DOUBLINGS_MAX`] times.
    fn ask_interval_ms(&self) -> u64 {
        REPAIR_RETRY_MS
            << self
                .store_refusals_in_a_row
                .min(REPAIR_STORE_BACKOFF_DOUBLINGS_MAX)
    }

    /// The log refused to store copies at `now_ms`: the next request
    /// waits the longer interval. Returns that wait (ms).
    fn store_refused(&mut self, now_ms: u64) -> u64 {
        self.stats.store_refusals += 1;
        self.store_refusals_in_a_row = self.store_refusals_in_a_row.saturating_add(1);
        let wait = self.ask_interval_ms();
        self.next_ask_ms = self.next_ask_ms.max(now_ms + wait);
        wait
    }

    /// The log stored copies at `now_ms`: requests go at the usual pace
    /// again, the next one no later than [`REPAIR_RETRY_MS`] from now.
    fn store_succeeded(&mut self, now_ms: u64) {
        self.store_refusals_in_a_row = 0;
        self.next_ask_ms = self.next_ask_ms.min(now_ms + REPAIR_RETRY_MS);
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
            let bytes = match &msg.body {
                Body::RepairEntries { entries, .. } => entries.iter().map(Entry::size_bytes).sum(),
                _ => 0,
            };
            let r = &mut self.repair;
            if r.inbox.len() < REPAIR_INBOX_MAX && r.inbox_bytes + bytes <= REPAIR_INBOX_BYTES_MAX {
                r.inbox_bytes += bytes;
                r.inbox.push(msg);
            }
            return;
        }
        self.raft.step(now_ms, msg);
    }

    /// Forgets entries to repair that the log holds now (an installed
    /// snapshot brought them), before a full check counts afresh.
    pub(super) fn forget_held(&mut self) {
        let wal = &self.wal;
        let held: Vec<Index> = self
            .repair
            .missing
            .iter()
            .copied()
            .filter(|&i| wal.holds(i))
            .collect();
        for i in held {
            self.repair.forget(i);
        }
    }

    /// Marks entries as missing here, to repair: ones the state refers to
    /// (`referenced`), checked when they come, or the rest of the range a
    /// snapshot image carries, taken without a check.
    pub(super) fn note_missing(
        &mut self,
        indexes: impl IntoIterator<Item = Index>,
        found: MissingFound,
        referenced: bool,
    ) {
        let added: Vec<Index> = indexes
            .into_iter()
            .filter(|&i| self.repair.missing.insert(i))
            .collect();
        let Some(&first) = added.first() else {
            return self.repair_leadership();
        };
        let what = if referenced {
            "the ledgers and queues refer to"
        } else {
            "below the snapshot that snapshot images carry"
        };
        log_warn!(
            "group {}: {} log entries {what} are missing or damaged here (the first: {first}); repairing them from a peer (this node does not lead until then)",
            self.group,
            added.len()
        );
        for &i in &added {
            self.note(|| Note::Missing { index: i, found });
            if !referenced {
                self.repair.unreferenced.insert(i);
            } else if self.machine.check_of(i).is_none() {
                self.repair.unverifiable.insert(i);
            }
        }
        // Asked for at once, unless the log is refusing what it gets
        // (the same lowest entries would come back and be refused again).
        if self.repair.store_refusals_in_a_row == 0 {
            self.repair.next_ask_ms = 0;
        }
        self.repair_leadership();
    }

    /// Drops what neither the state nor its snapshot's image needs any
    /// more, and says whether this node may lead.
    fn repair_leadership(&mut self) {
        if !self.repair.missing.is_empty() {
            // The image of Raft's snapshot carries the entries from the
            // lowest its state refers to, which is at or below the lowest
            // the state in memory refers to.
            let oldest = self.keep_from().unwrap_or(Index::MAX);
            let r = &mut self.repair;
            let released: Vec<Index> = r.missing.range(..oldest).copied().collect();
            for i in released {
                r.forget(i);
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
    /// sent, answers again what waited for cold reads, and asks the next
    /// peer if it is time.
    pub(super) fn drive_repair(&mut self, now_ms: u64, out: &mut Vec<Message>) {
        let deferred = std::mem::take(&mut self.repair.deferred);
        self.repair.inbox_bytes = 0;
        // One answer a peer a turn (the network may duplicate a request):
        // its newest request, in place of one kept from an earlier turn.
        let mut asked = BTreeSet::new();
        for msg in std::mem::take(&mut self.repair.inbox).into_iter().rev() {
            match msg.body {
                Body::RepairRequest { indexes } if asked.insert(msg.from) => {
                    self.serve_repair(msg.from, indexes, out)
                }
                Body::RepairEntries { entries, not_held } => {
                    self.take_repair(now_ms, msg.from, entries, &not_held)
                }
                _ => {}
            }
        }
        for (from, indexes) in deferred {
            if !asked.contains(&from) {
                self.serve_repair(from, indexes, out);
            }
        }
        if self.repair.missing.is_empty() || now_ms < self.repair.next_ask_ms {
            return;
        }
        self.repair.next_ask_ms = now_ms + self.repair.ask_interval_ms();
        // At most once a round: what acks and deletes released, and what
        // every other member said it lacks.
        self.mark_lost();
        self.repair_leadership();
        let others = self.other_members();
        if others.is_empty() {
            return;
        }
        let to = others[self.repair.next_peer % others.len()];
        self.repair.next_peer = self.repair.next_peer.wrapping_add(1);
        // What this peer has not said it lacks, those not lost first (a
        // lost one is asked for only when nothing else is: lost entries
        // must not crowd out ones that can be repaired); unverifiable
        // entries are never taken, so never asked for.
        let r = &self.repair;
        let wanted = |lost: bool| {
            r.missing
                .iter()
                .copied()
                .filter(move |i| !r.unverifiable.contains(i) && r.lost.contains(i) == lost)
                .filter(move |i| lost || r.not_held_by.get(i).is_none_or(|s| !s.contains(&to)))
        };
        let mut indexes: Vec<Index> = wanted(false).take(REPAIR_INDEXES_MAX).collect();
        if indexes.is_empty() {
            indexes = wanted(true).take(REPAIR_INDEXES_MAX).collect();
        }
        if indexes.is_empty() {
            return;
        }
        self.repair.stats.requests += 1;
        out.push(Message {
            from: self.raft.id(),
            to,
            term: self.raft.term(),
            body: Body::RepairRequest { indexes },
        });
    }

    /// The group's other members (voters and learners, in id order).
    fn other_members(&self) -> Vec<NodeId> {
        let me = self.raft.id();
        let m = self.raft.membership();
        let all: BTreeSet<NodeId> = m.voters.iter().chain(&m.learners).copied().collect();
        all.into_iter().filter(|&p| p != me).collect()
    }

    /// Answers `from`'s request for `indexes`, or, when it has nothing to
    /// send yet because cold reads for it are under way, keeps it to
    /// answer on a later turn (at most one kept per peer, and at most
    /// [`REPAIR_DEFERRED_MAX`] peers).
    fn serve_repair(&mut self, from: NodeId, indexes: Vec<Index>, out: &mut Vec<Message>) {
        let (entries, not_held, reading) = self.answer_repair(&indexes);
        let keep = reading
            && entries.is_empty()
            && (self.repair.deferred.len() < REPAIR_DEFERRED_MAX
                || self.repair.deferred.contains_key(&from));
        if keep {
            self.repair.deferred.insert(from, indexes);
            return;
        }
        self.repair.stats.served += entries.len() as u64;
        out.push(Message {
            from: self.raft.id(),
            to: from,
            term: self.raft.term(),
            body: Body::RepairEntries { entries, not_held },
        });
    }

    /// This replica's copies of the entries at `indexes` it can send now,
    /// those it holds no (good) copy of, and whether it is reading some
    /// back from disk.
    fn answer_repair(&mut self, indexes: &[Index]) -> (Vec<Entry>, Vec<Index>, bool) {
        let commit = self.raft.commit_index();
        // Room for the not-held list too (a varint each, at most 10 bytes).
        let budget = self.entry_bytes_max.saturating_sub(REPAIR_INDEXES_MAX * 10);
        let (mut entries, mut not_held) = (Vec::new(), Vec::new());
        let mut bytes = 0;
        let mut reading = false;
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
                    Ok(CachedRead::Reading) => {
                        reading = true;
                        continue;
                    }
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
        (entries, not_held, reading)
    }

    /// Takes the copies `from` sent: each that the state's check vouches
    /// for is stored durably, then served; the rest are refused.
    fn take_repair(&mut self, now_ms: u64, from: NodeId, entries: Vec<Entry>, not_held: &[Index]) {
        let unverified = self.planted_workload == Some(WorkloadBug::RepairUnverified);
        let mut good = Vec::new();
        for e in entries {
            if !self.repair.missing.contains(&e.index)
                || good.last().is_some_and(|g: &Entry| g.index >= e.index)
            {
                continue;
            }
            if self.repair.unreferenced.contains(&e.index) {
                good.push(e); // nothing checks it: never served, only carried
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
                // Asked of it again: a peer's copy passes its own check
                // (the same as ours), so a wrong one went bad on its way
                // here; counting the peer as holding none could make the
                // entry lost while good copies exist.
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
                    self.repair.store_succeeded(now_ms);
                    let n = good.len() as u64;
                    for e in &good {
                        self.repair.forget(e.index);
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
                    let wait = self.repair.store_refused(now_ms);
                    log_warn!(
                        "group {}: storing repaired entries: {e} (asking peers again in {wait} ms)",
                        self.group
                    )
                }
                Err(e) => self.stop(format!("{e}")),
            }
        }
        self.repair_leadership();
    }

    /// Entries every other member said it holds no (good) copy of: lost.
    /// In a group of one, every missing entry is.
    fn mark_lost(&mut self) {
        let others: BTreeSet<NodeId> = self.other_members().into_iter().collect();
        let r = &mut self.repair;
        let newly: Vec<Index> = r
            .missing
            .iter()
            .copied()
            .filter(|i| !r.lost.contains(i) && !r.unverifiable.contains(i))
            .filter(|i| {
                r.not_held_by
                    .get(i)
                    .map_or(others.is_empty(), |by| others.is_subset(by))
            })
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

    /// Whether entry `i` is missing here, being repaired, and a copy of it
    /// will be checked (the state refers to it).
    pub(crate) fn repair_checks(&self, i: Index) -> bool {
        self.repair.missing.contains(&i) && !self.repair.unreferenced.contains(&i)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Refused stores back the requests off, doubling up to 12.8 s and
    /// counted; one stored batch brings the pace back to 200 ms.
    #[test]
    fn refused_stores_back_requests_off_until_one_succeeds() {
        let mut r = Repair::default();
        assert_eq!(r.ask_interval_ms(), REPAIR_RETRY_MS);
        let waits: Vec<u64> = (0..9).map(|k| r.store_refused(1_000 * k)).collect();
        assert_eq!(
            waits,
            [400, 800, 1_600, 3_200, 6_400, 12_800, 12_800, 12_800, 12_800]
        );
        assert_eq!(r.stats.store_refusals, 9);
        assert_eq!(r.next_ask_ms, 8_000 + 12_800, "the next request waits");
        r.store_succeeded(9_000);
        assert_eq!(r.ask_interval_ms(), REPAIR_RETRY_MS);
        assert_eq!(
            r.next_ask_ms,
            9_000 + REPAIR_RETRY_MS,
            "the next request comes sooner"
        );
        assert_eq!(r.stats.store_refusals, 9, "the count stays");
        // A refusal never brings a later request forward.
        r.next_ask_ms = 50_000;
        r.store_refused(0);
        assert_eq!(r.next_ask_ms, 50_000);
    }
}
