//! The core's view of its log: the entries after the latest snapshot, which
//! of them storage has been handed and has made durable, and the commit and
//! apply positions. No I/O: storage is told what to write through `Ready`.
//!
//! Positions, always ordered:
//! `snapshot_index <= applied <= applying <= commit` and
//! `persisted <= handed_out <= last_index`, with `applying <= persisted`.

use super::types::{Entry, Index, Term};
use std::collections::VecDeque;

/// The in-memory log of one replica.
#[derive(Debug, Clone)]
pub(crate) struct RaftLog {
    /// Last index covered by the snapshot (0 if none).
    pub(crate) snapshot_index: Index,
    /// Term of the entry at `snapshot_index` (0 if none).
    pub(crate) snapshot_term: Term,
    /// Entries from `snapshot_index + 1`, consecutive.
    entries: VecDeque<Entry>,
    /// Highest index known committed.
    pub(crate) commit: Index,
    /// Highest index storage reported durable.
    pub(crate) persisted: Index,
    /// Highest index already handed to storage in a `Ready`.
    handed_out: Index,
    /// Storage holds entries at or after this index that the core replaced;
    /// the next `Ready` tells it to drop them before appending.
    pending_truncate: Option<Index>,
    /// Highest index handed out for applying.
    pub(crate) applying: Index,
    /// Highest index the caller reported applied.
    pub(crate) applied: Index,
}

impl RaftLog {
    /// A log that starts after `(snapshot_index, snapshot_term)` and holds
    /// `entries`, all of them already durable.
    pub(crate) fn restored(
        snapshot_index: Index,
        snapshot_term: Term,
        entries: Vec<Entry>,
        commit: Index,
    ) -> Self {
        for (i, e) in entries.iter().enumerate() {
            assert_eq!(
                e.index,
                snapshot_index + 1 + i as u64,
                "restored entries must be consecutive after the snapshot"
            );
        }
        let last = snapshot_index + entries.len() as u64;
        assert!(
            commit <= last,
            "durable commit {commit} is beyond the durable log end {last}"
        );
        let commit = commit.max(snapshot_index);
        RaftLog {
            snapshot_index,
            snapshot_term,
            entries: entries.into(),
            commit,
            persisted: last,
            handed_out: last,
            pending_truncate: None,
            applying: snapshot_index,
            applied: snapshot_index,
        }
    }

    /// Index of the last entry (the snapshot index if the log is empty).
    pub(crate) fn last_index(&self) -> Index {
        self.snapshot_index + self.entries.len() as u64
    }

    /// Term of the last entry.
    pub(crate) fn last_term(&self) -> Term {
        self.entries.back().map_or(self.snapshot_term, |e| e.term)
    }

    /// First index still held as an entry.
    pub(crate) fn first_index(&self) -> Index {
        self.snapshot_index + 1
    }

    /// Term of the entry at `index`; `None` if compacted away or not present.
    pub(crate) fn term(&self, index: Index) -> Option<Term> {
        if index == self.snapshot_index {
            return Some(self.snapshot_term);
        }
        self.entry(index).map(|e| e.term)
    }

    /// The entry at `index`, if held.
    pub(crate) fn entry(&self, index: Index) -> Option<&Entry> {
        if index <= self.snapshot_index || index > self.last_index() {
            return None;
        }
        self.entries.get((index - self.snapshot_index - 1) as usize)
    }

    /// True if the log holds `index` with `term` (the AppendEntries
    /// consistency check, thesis §3.5).
    pub(crate) fn matches(&self, index: Index, term: Term) -> bool {
        self.term(index) == Some(term)
    }

    /// Entries from `from` to `to` inclusive, stopping once `max_bytes` is
    /// reached but always returning at least one if any is in range.
    pub(crate) fn slice(&self, from: Index, to: Index, max_bytes: usize) -> Vec<Entry> {
        let mut out = Vec::new();
        let mut bytes = 0;
        let mut i = from.max(self.first_index());
        while i <= to.min(self.last_index()) {
            let e = self.entry(i).expect("index within bounds");
            bytes += e.size_bytes();
            if !out.is_empty() && bytes > max_bytes {
                break;
            }
            out.push(e.clone());
            i += 1;
        }
        out
    }

    /// Entries at or after `from` (not yet compacted), in order.
    pub(crate) fn iter_from(&self, from: Index) -> impl Iterator<Item = &Entry> {
        let skip = from.saturating_sub(self.first_index()) as usize;
        self.entries.iter().skip(skip)
    }

    /// Appends entries created by this node as leader.
    pub(crate) fn append(&mut self, entry: Entry) {
        assert_eq!(
            entry.index,
            self.last_index() + 1,
            "leader appends in order"
        );
        self.entries.push_back(entry);
    }

    /// Drops every entry at or after `from`. Committed entries are never
    /// dropped: that would break the promise made to clients.
    pub(crate) fn truncate(&mut self, from: Index) {
        assert!(
            from > self.commit,
            "refusing to truncate committed entry {from} (commit {})",
            self.commit
        );
        assert!(from > self.snapshot_index);
        self.entries
            .truncate((from - self.snapshot_index - 1) as usize);
        if from <= self.handed_out {
            self.pending_truncate = Some(self.pending_truncate.map_or(from, |t| t.min(from)));
            self.handed_out = from - 1;
        }
        self.persisted = self.persisted.min(from - 1);
    }

    /// Follower side of AppendEntries after the consistency check passed:
    /// skips entries already present, truncates at the first conflicting
    /// one, appends the rest. Returns the index of the last entry of the
    /// message (thesis figure 3.1 receiver rules 3 and 4).
    pub(crate) fn merge(&mut self, prev_index: Index, entries: Vec<Entry>) -> Index {
        let last_new = prev_index + entries.len() as u64;
        let mut to_append = Vec::new();
        for e in entries {
            if !to_append.is_empty() {
                to_append.push(e);
                continue;
            }
            if e.index <= self.snapshot_index {
                continue; // already covered by the snapshot, hence committed
            }
            match self.term(e.index) {
                Some(t) if t == e.term => {}
                Some(_) => {
                    self.truncate(e.index);
                    to_append.push(e);
                }
                None => to_append.push(e),
            }
        }
        for e in to_append {
            self.append(e);
        }
        last_new
    }

    /// The largest index at or below `index` whose term is at most `term`,
    /// with that term: the fast back-off probe of thesis §5.3.
    pub(crate) fn find_conflict_by_term(&self, index: Index, term: Term) -> (Index, Term) {
        let mut i = index.min(self.last_index());
        loop {
            match self.term(i) {
                Some(t) if t <= term => return (i, t),
                Some(_) if i > self.snapshot_index => i -= 1,
                _ => return (self.snapshot_index, self.snapshot_term),
            }
        }
    }

    /// Raises the commit index; never lowers it.
    pub(crate) fn commit_to(&mut self, index: Index) -> bool {
        if index > self.commit {
            assert!(
                index <= self.last_index(),
                "commit {index} beyond last index {}",
                self.last_index()
            );
            self.commit = index;
            true
        } else {
            false
        }
    }

    /// Takes what storage must do next: an optional truncation point and
    /// the entries it has not been handed yet.
    pub(crate) fn take_unstable(&mut self) -> (Option<Index>, Vec<Entry>) {
        let truncate = self.pending_truncate.take();
        let from = self.handed_out + 1;
        let entries: Vec<Entry> = self.iter_from(from).cloned().collect();
        self.handed_out = self.last_index();
        (truncate, entries)
    }

    /// Storage reports `index` (with `term`) durable. Stale reports for
    /// entries since replaced are ignored.
    pub(crate) fn persisted_to(&mut self, index: Index, term: Term) -> bool {
        if index > self.persisted && index <= self.handed_out && self.matches(index, term) {
            self.persisted = index;
            true
        } else {
            false
        }
    }

    /// Committed, locally durable entries not yet handed out for applying.
    pub(crate) fn take_committed(&mut self, max_bytes: usize) -> Vec<Entry> {
        let hi = self.commit.min(self.persisted);
        if hi <= self.applying {
            return Vec::new();
        }
        let out = self.slice(self.applying + 1, hi, max_bytes);
        if let Some(last) = out.last() {
            self.applying = last.index;
        }
        out
    }

    /// Forgets entries up to and including `index`, which a snapshot now
    /// covers.
    pub(crate) fn compact(&mut self, index: Index) {
        assert!(index <= self.applied, "compacting beyond applied");
        if index <= self.snapshot_index {
            return;
        }
        let term = self.term(index).expect("compacted index is held");
        let drop = (index - self.snapshot_index) as usize;
        self.entries.drain(..drop);
        self.snapshot_index = index;
        self.snapshot_term = term;
    }

    /// Replaces the whole log with a snapshot received from the leader.
    pub(crate) fn reset_to_snapshot(&mut self, index: Index, term: Term) {
        assert!(
            index > self.commit,
            "a snapshot at or below commit is not installed"
        );
        // Only the old committed prefix is known to agree with the snapshot;
        // the snapshot itself is durable once storage reports it.
        self.persisted = self.persisted.min(self.commit);
        self.entries.clear();
        self.snapshot_index = index;
        self.snapshot_term = term;
        self.commit = index;
        // Storage replaces its log with the snapshot in the same write.
        self.pending_truncate = None;
        self.handed_out = index;
        self.applying = index;
        self.applied = index;
    }

    /// Number of entries held in memory.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}
