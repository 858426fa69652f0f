//! The shadow of one group's log on one node: what the checkers hold the
//! node to. The production replica's tap says what it asked its log to
//! write under which ticket (`submit_as`); the device says which tickets
//! it really synced (`complete_through`). The shadow never asks the WAL,
//! and holds no bytes: entries, hard state, snapshot, and the chain hash
//! of every durable prefix (see `trace::chain`).

use super::trace::chain;
use crate::consensus::{Entry, HardState, Index, Snapshot};
use std::collections::{BTreeSet, VecDeque};

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
    /// The chain hash at the snapshot (the cluster's, from the checker).
    pub(crate) base_chain: Option<u64>,
}

impl Durable {
    /// Index and chain hash at the snapshot (0, 0 without one).
    pub(crate) fn base(&self) -> (Index, u64) {
        self.snapshot
            .as_ref()
            .map_or((0, 0), |s| (s.index, self.base_chain.unwrap_or(0)))
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

    /// True while recovery damage is pending or being repaired.
    pub(crate) fn is_damaged(&self) -> bool {
        self.latent_damage.is_some() || self.repair_until.is_some()
    }

    /// Damage the log from `index` on, to be found at the next recovery.
    pub(crate) fn damage_from(&mut self, index: Index) {
        self.latent_damage = Some(self.latent_damage.map_or(index, |d| d.min(index)));
    }
}

/// What applying an op to the durable image produced, for the checkers.
pub(crate) struct Applied {
    /// Entries that became durable, with their prefix chain hashes.
    pub(crate) new_entries: Vec<(Index, u64, u64)>,
}

/// One group's shadow log on one node: the durable image, and the writes
/// queued under their tickets.
#[derive(Debug, Default)]
pub(crate) struct SimDisk {
    pub(crate) durable: Durable,
    volatile: VecDeque<(u64, DiskOp)>,
    /// As a shadow of a real log: the lowest index a write lost in a
    /// crash rewrote from, which recovery may hold instead of this model.
    pub(crate) lost_rewrite_from: Option<Index>,
    /// Entries below the snapshot the simulator damaged or lost here
    /// (ever): a referenced entry the replica finds missing must be one.
    pub(crate) damaged_below: BTreeSet<Index>,
    /// Of those, the ones no repair has stored again yet.
    pub(crate) unrepaired_below: BTreeSet<Index>,
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
            out.push(Self::apply(&mut self.durable, op));
        }
        out
    }

    /// True if ops are queued and not durable.
    pub(crate) fn has_volatile(&self) -> bool {
        !self.volatile.is_empty()
    }

    /// Applies an op that is durable at once (a synchronous install).
    pub(crate) fn apply_now(&mut self, op: DiskOp) -> Applied {
        Self::apply(&mut self.durable, op)
    }

    /// The ops queued and not durable, taken (a crash: the device, not
    /// this model, decides what of them survived).
    pub(crate) fn take_volatile(&mut self) -> Vec<DiskOp> {
        self.volatile.drain(..).map(|(_, op)| op).collect()
    }

    fn apply(d: &mut Durable, op: DiskOp) -> Applied {
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
                for e in entries {
                    let (index, term) = (e.index, e.term);
                    d.append(e);
                    new_entries.push((index, term, *d.prefix.last().expect("just pushed")));
                }
                if let Some(hs) = hard_state {
                    d.hard_state = hs;
                }
            }
            DiskOp::Compact {
                snapshot: s,
                snapshot_chain,
                retained,
            } => {
                if s.index > d.base().0 {
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
        Applied { new_entries }
    }
}
