//! A simulated disk holding one group's replica on one node.
//!
//! Writes sit in a volatile queue until their fsync completes; completions
//! come in submission order (one queue per disk). A crash keeps a random
//! prefix of the unsynced writes (data that reached the platter without an
//! fsync) and may tear the first write it does not keep: some of its
//! entries survive, its hard state does not (the superblock is written
//! last and has two copies, so it is either old or new). EIO is injected
//! per disk and stops the group on that node, as the WAL does. This is a
//! model of a disk under one replica, not `storage::Wal`: no on-disk
//! format, no recovery scan.

use super::trace::chain;
use crate::consensus::{Entry, HardState, Index, RestoredState, Snapshot};
use rand::Rng;
use std::collections::VecDeque;

/// One write the core asked for.
#[derive(Clone, Debug)]
pub(crate) enum DiskOp {
    /// A `Ready`'s write: snapshot install, then truncate, append, hard state.
    Write {
        snapshot: Option<Snapshot>,
        /// The chain hash at `snapshot`, where its data does not carry it.
        snapshot_chain: Option<u64>,
        /// The entries below `snapshot` that its machine refers to.
        snapshot_entries: Vec<Entry>,
        truncate_from: Option<Index>,
        entries: Vec<Entry>,
        hard_state: Option<HardState>,
    },
    /// A local snapshot: store it and drop the entries it covers, except
    /// `retained`, which its machine still refers to.
    Compact {
        snapshot: Snapshot,
        /// The chain hash at `snapshot`, where its data does not carry it.
        snapshot_chain: Option<u64>,
        retained: Vec<Entry>,
    },
}

/// What survives a crash.
#[derive(Clone, Debug, Default)]
pub(crate) struct Durable {
    pub(crate) hard_state: HardState,
    pub(crate) snapshot: Option<Snapshot>,
    pub(crate) entries: Vec<Entry>,
    /// Entries at or below the snapshot that its machine refers to.
    pub(crate) retained: Vec<Entry>,
    /// Chain hash of the log prefix ending at each entry (see `trace::chain`).
    pub(crate) prefix: Vec<u64>,
    /// Damage not yet noticed: from this index on, entries will fail their
    /// checksums at the next recovery (bit rot, a misdirected write).
    pub(crate) latent_damage: Option<Index>,
    /// Entries recovery found damaged, (index, prefix hash): still on the
    /// platter, unreadable, and counted as held while the node repairs them
    /// without voting.
    pub(crate) damaged: Vec<(Index, u64)>,
    /// The node must not vote until its log is durable up to here.
    pub(crate) repair_until: Option<Index>,
    /// The chain hash at the snapshot, where the snapshot's data does not
    /// start with it (the production replica's snapshots).
    pub(crate) base_chain: Option<u64>,
}

impl Durable {
    /// Index and chain hash at the snapshot (0, 0 without one).
    pub(crate) fn base(&self) -> (Index, u64) {
        self.snapshot.as_ref().map_or((0, 0), |s| {
            (
                s.index,
                self.base_chain.unwrap_or_else(|| snapshot_chain(s)),
            )
        })
    }

    /// Chain hash of the durable prefix ending at `index`, if this disk can
    /// tell: `Some(None)` means the snapshot covers it (no per-index hash).
    pub(crate) fn prefix_at(&self, index: Index) -> Option<Option<u64>> {
        let (base, _) = self.base();
        if index <= base {
            return Some(None);
        }
        let pos = (index - base - 1) as usize;
        if let Some(&p) = self.prefix.get(pos) {
            return Some(Some(p));
        }
        self.damaged
            .iter()
            .find(|(i, _)| *i == index)
            .map(|&(_, p)| Some(p))
    }

    pub(crate) fn last_index(&self) -> Index {
        self.base().0 + self.entries.len() as u64
    }

    fn truncate_from(&mut self, from: Index) {
        self.damaged.retain(|&(i, _)| i < from);
        let (base, _) = self.base();
        let keep = from.saturating_sub(base + 1) as usize;
        self.entries.truncate(keep);
        self.prefix.truncate(keep);
    }

    fn append(&mut self, e: Entry) {
        assert_eq!(
            e.index,
            self.last_index() + 1,
            "disk appends must be consecutive"
        );
        let prev = self.prefix.last().copied().unwrap_or_else(|| self.base().1);
        self.prefix.push(chain(prev, &e));
        self.entries.push(e);
        if self.repair_until.is_some_and(|u| self.last_index() >= u) {
            self.repair_until = None; // re-fetched: the damaged copies are superseded
            self.damaged.clear();
        }
    }

    /// Recovery: latent damage is found now; the trusted log ends before
    /// it and the node restarts in repair mode.
    pub(crate) fn recover(&mut self) -> RestoredState {
        if let Some(at) = self.latent_damage.take() {
            let (base, _) = self.base();
            if at > base && at <= self.last_index() {
                let keep = (at - base - 1) as usize;
                let lost: Vec<(Index, u64)> = self.entries[keep..]
                    .iter()
                    .zip(&self.prefix[keep..])
                    .map(|(e, &p)| (e.index, p))
                    .collect();
                self.repair_until = Some(self.last_index().max(self.repair_until.unwrap_or(0)));
                self.damaged.extend(lost);
                self.entries.truncate(keep);
                self.prefix.truncate(keep);
            }
        }
        // What recovery can vouch for: a commit beyond the trusted end is
        // forgotten with the damage (commit is persisted lazily anyway).
        let trusted_end = self.last_index();
        self.hard_state.commit = self.hard_state.commit.min(trusted_end).max(self.base().0);
        RestoredState {
            hard_state: self.hard_state,
            snapshot: self.snapshot.clone(),
            entries: self.entries.clone(),
            repair_until: self.repair_until,
        }
    }

    /// True while recovery damage is pending or being repaired.
    pub(crate) fn is_damaged(&self) -> bool {
        self.latent_damage.is_some() || self.repair_until.is_some()
    }

    /// Damage the log from `index` on, to be found at the next recovery.
    pub(crate) fn damage_from(&mut self, index: Index) {
        self.latent_damage = Some(self.latent_damage.map_or(index, |d| d.min(index)));
    }

    /// Index range of the durable log, for choosing where damage strikes.
    pub(crate) fn range(&self) -> (Index, Index) {
        (self.base().0 + 1, self.last_index())
    }
}

/// The state-machine chain hash a snapshot carries.
pub(crate) fn snapshot_chain(s: &Snapshot) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&s.data[..8]);
    u64::from_le_bytes(b)
}

/// What applying an op to the durable image produced, for the checkers.
pub(crate) struct Applied {
    /// Entries that became durable, with their prefix chain hashes.
    pub(crate) new_entries: Vec<(Index, u64, u64)>,
    /// The durable commit before and after.
    pub(crate) commit_before: Index,
    pub(crate) commit_after: Index,
}

/// One simulated disk.
#[derive(Debug, Default)]
pub(crate) struct SimDisk {
    pub(crate) durable: Durable,
    volatile: VecDeque<(u64, DiskOp)>,
    next_write_id: u64,
    /// The disk serves one write at a time: completion of the last one.
    pub(crate) busy_until_ms: u64,
    /// Incremented at every crash; completions of older writes are void.
    pub(crate) epoch: u64,
    /// Fail the next write with EIO.
    pub(crate) fail_next_write: bool,
    /// The disk completes nothing before this (a stalled disk).
    pub(crate) stalled_until_ms: u64,
    /// As a shadow of a real log: the lowest index a write lost in a
    /// crash rewrote from, which recovery may hold instead of this model.
    pub(crate) lost_rewrite_from: Option<Index>,
}

impl SimDisk {
    /// Queues an op under an id of the caller's (a WAL ticket), which
    /// must not go back.
    pub(crate) fn submit_as(&mut self, id: u64, op: DiskOp) {
        assert!(self.volatile.back().is_none_or(|(last, _)| *last <= id));
        self.volatile.push_back((id, op));
    }

    /// Every op queued under an id up to `id` became durable, in order.
    pub(crate) fn complete_through(&mut self, id: u64) -> Vec<Applied> {
        let mut out = Vec::new();
        while self.volatile.front().is_some_and(|(i, _)| *i <= id) {
            let (_, op) = self.volatile.pop_front().expect("front exists");
            out.push(Self::apply(&mut self.durable, op, None));
        }
        out
    }

    /// True if ops are queued and not durable.
    pub(crate) fn has_volatile(&self) -> bool {
        !self.volatile.is_empty()
    }

    /// Applies an op that is durable at once (a synchronous install).
    pub(crate) fn apply_now(&mut self, op: DiskOp) -> Applied {
        Self::apply(&mut self.durable, op, None)
    }

    /// The ops queued and not durable, taken (a crash: the device, not
    /// this model, decides what of them survived).
    pub(crate) fn take_volatile(&mut self) -> Vec<DiskOp> {
        self.volatile.drain(..).map(|(_, op)| op).collect()
    }

    /// Queues an op; returns its write id.
    pub(crate) fn submit(&mut self, op: DiskOp) -> u64 {
        self.next_write_id += 1;
        self.volatile.push_back((self.next_write_id, op));
        self.next_write_id
    }

    /// The fsync covering `write_id` completed: make it durable.
    pub(crate) fn complete(&mut self, write_id: u64) -> Applied {
        let (id, op) = self.volatile.pop_front().expect("a write is in flight");
        assert_eq!(id, write_id, "disk completions are in submission order");
        Self::apply(&mut self.durable, op, None)
    }

    fn apply(d: &mut Durable, op: DiskOp, torn_keep: Option<usize>) -> Applied {
        let commit_before = d.hard_state.commit;
        let mut new_entries = Vec::new();
        match op {
            DiskOp::Write {
                snapshot,
                snapshot_chain,
                snapshot_entries,
                truncate_from,
                entries,
                hard_state,
            } => {
                if let Some(s) = snapshot {
                    if torn_keep.is_some() {
                        // A torn install leaves the old log in place.
                        return Applied {
                            new_entries,
                            commit_before,
                            commit_after: commit_before,
                        };
                    }
                    d.entries.clear();
                    d.prefix.clear();
                    d.damaged.retain(|&(i, _)| i > s.index);
                    if d.repair_until.is_some_and(|u| u <= s.index) {
                        d.repair_until = None;
                        d.damaged.clear();
                    }
                    d.snapshot = Some(s);
                    d.base_chain = snapshot_chain;
                    d.retained = snapshot_entries;
                }
                if let Some(t) = truncate_from {
                    d.truncate_from(t);
                }
                let keep = torn_keep.unwrap_or(entries.len());
                for e in entries.into_iter().take(keep) {
                    let (index, term) = (e.index, e.term);
                    d.append(e);
                    new_entries.push((index, term, *d.prefix.last().expect("just pushed")));
                }
                if torn_keep.is_none() {
                    if let Some(hs) = hard_state {
                        d.hard_state = hs;
                    }
                }
            }
            DiskOp::Compact {
                snapshot: s,
                snapshot_chain,
                retained,
            } => {
                if torn_keep.is_none() && s.index > d.base().0 {
                    d.retained = retained;
                    let drop = (s.index - d.base().0) as usize;
                    assert!(drop <= d.entries.len(), "compacting beyond the durable log");
                    d.entries.drain(..drop);
                    d.prefix.drain(..drop);
                    d.damaged.retain(|&(i, _)| i > s.index);
                    d.snapshot = Some(s);
                    d.base_chain = snapshot_chain;
                }
            }
        }
        Applied {
            new_entries,
            commit_before,
            commit_after: d.hard_state.commit,
        }
    }

    /// Power loss: a random prefix of the unsynced writes survives, and the
    /// next one may be torn. Returns what became durable that way.
    pub(crate) fn crash(&mut self, rng: &mut impl Rng) -> Vec<Applied> {
        self.epoch += 1;
        self.fail_next_write = false;
        let ops: Vec<DiskOp> = self.volatile.drain(..).map(|(_, op)| op).collect();
        let keep = if ops.is_empty() {
            0
        } else {
            rng.gen_range(0..=ops.len())
        };
        let mut out = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            if i < keep {
                out.push(Self::apply(&mut self.durable, op, None));
            } else {
                if let DiskOp::Write { entries, .. } = &op {
                    if !entries.is_empty() && rng.gen_bool(0.5) {
                        let torn = rng.gen_range(0..entries.len());
                        out.push(Self::apply(&mut self.durable, op, Some(torn)));
                    }
                }
                break;
            }
        }
        out
    }
}
