//! Snapshots (thesis §5.1–§5.3): compacting the log once the state machine
//! has captured it, sending the snapshot to a follower that needs compacted
//! entries, and installing one received from the leader.
//!
//! The snapshot's `data` is whatever the state machine encodes; in quire it
//! is metadata only (ledger table, queue ack state), since the log segments
//! themselves are the data.

use super::{AppendResult, Body, Index, Membership, NodeId, Raft, RaftError, Snapshot, Term};

impl Raft {
    /// The caller captured its state machine at applied index `index` in
    /// `data`: record the snapshot and forget the log up to it. Returns the
    /// snapshot, which the caller persists before trimming its log storage.
    pub fn compact(&mut self, index: Index, data: Vec<u8>) -> Result<Snapshot, RaftError> {
        let (term, membership) = self.snapshot_meta(index)?;
        let snapshot = Snapshot {
            index,
            term,
            membership,
            data,
        };
        self.compact_prepared(snapshot.clone())?;
        Ok(snapshot)
    }

    /// The term and membership a snapshot at `index` (applied, newer than
    /// the current snapshot) records: what a caller building the snapshot
    /// on another thread needs before handing it to `compact_prepared`.
    pub fn snapshot_meta(&self, index: Index) -> Result<(Term, Membership), RaftError> {
        if index > self.log.applied {
            return Err(RaftError::InvalidIndex(format!(
                "snapshot at {index} is beyond the applied index {}",
                self.log.applied
            )));
        }
        if index <= self.log.snapshot_index {
            return Err(RaftError::InvalidIndex(format!(
                "snapshot at {index} is not newer than the current one at {}",
                self.log.snapshot_index
            )));
        }
        let term = self.log.term(index).expect("applied entries are held");
        Ok((term, self.membership_at(index)))
    }

    /// Compacts the log into `snapshot`, built (perhaps on another thread)
    /// from `snapshot_meta`; refused if the log moved past it meanwhile
    /// (a newer snapshot, or one installed from the leader).
    pub fn compact_prepared(&mut self, snapshot: Snapshot) -> Result<(), RaftError> {
        let (term, _) = self.snapshot_meta(snapshot.index)?;
        if term != snapshot.term {
            return Err(RaftError::InvalidIndex(format!(
                "snapshot at {} has term {}, the log {term}",
                snapshot.index, snapshot.term
            )));
        }
        let index = snapshot.index;
        let membership = snapshot.membership.clone();
        self.log.compact(index);
        // Keep the membership in force at the snapshot and every later one.
        let later = self.memberships.split_off(&(index + 1));
        self.memberships.clear();
        self.memberships.insert(index, membership);
        self.memberships.extend(later);
        self.snapshot = Some(snapshot);
        Ok(())
    }

    /// Leader: send our latest snapshot to a follower that needs entries we
    /// no longer hold.
    pub(super) fn send_snapshot(&mut self, peer: NodeId) {
        let Some(snapshot) = self.snapshot.clone() else {
            unreachable!("entries are compacted only into a snapshot");
        };
        let now = self.now_ms;
        if let Some(pr) = self.progress.get_mut(&peer) {
            pr.become_snapshot(snapshot.index, now);
        }
        self.stats.snapshots_sent += 1;
        self.send(peer, Body::InstallSnapshot { snapshot });
    }

    /// Follower: InstallSnapshot receiver (thesis figure 5.3).
    pub(super) fn handle_install_snapshot(&mut self, from: NodeId, snapshot: Snapshot) {
        if !self.follow(from) {
            return;
        }
        let index = snapshot.index;
        if index <= self.log.commit {
            // Already have everything it covers.
            let match_index = self.log.commit;
            self.send(
                from,
                Body::AppendResponse(AppendResult::Accepted { match_index }),
            );
            return;
        }
        if self.log.matches(index, snapshot.term) {
            // Figure 5.3 rule 6: our log already holds the snapshot's last
            // entry, so keep what follows it and just learn the commit.
            self.log.commit_to(index);
            self.send(
                from,
                Body::AppendResponse(AppendResult::Accepted { match_index: index }),
            );
            return;
        }
        self.log.reset_to_snapshot(index, snapshot.term);
        self.memberships.clear();
        self.memberships.insert(index, snapshot.membership.clone());
        self.snapshot = Some(snapshot.clone());
        self.pending_snapshot_install = Some(snapshot);
        self.stats.snapshots_installed += 1;
        self.send(
            from,
            Body::AppendResponse(AppendResult::Accepted { match_index: index }),
        );
    }
}
