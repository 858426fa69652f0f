//! Snapshots (thesis §5.1–§5.3): compacting the log once the state machine
//! has captured it, sending the snapshot to a follower that needs compacted
//! entries, and installing one received from the leader.
//!
//! The snapshot's `data` is whatever the state machine encodes; in quire it
//! is metadata only (ledger table, queue ack state), since the log segments
//! themselves are the data.

use super::{
    AppendResult, Body, Index, Membership, NodeId, Raft, RaftError, ReplicationState, Snapshot,
    Term,
};

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
        drop(self.compact_prepared(snapshot.clone())?);
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
    /// (a newer snapshot, or one installed from the leader). Returns the
    /// snapshot it replaces, for the caller to free where it likes (tens
    /// of megabytes take a while to give back).
    pub fn compact_prepared(&mut self, snapshot: Snapshot) -> Result<Option<Snapshot>, RaftError> {
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
        Ok(self.snapshot.replace(snapshot))
    }

    /// Leader: send our latest snapshot to a follower that needs entries we
    /// no longer hold, from its first chunk.
    pub(super) fn send_snapshot(&mut self, peer: NodeId) {
        let Some(index) = self.snapshot.as_ref().map(|s| s.index) else {
            unreachable!("entries are compacted only into a snapshot");
        };
        let now = self.now_ms;
        if let Some(pr) = self.progress.get_mut(&peer) {
            pr.become_snapshot(index, now);
        }
        self.stats.snapshots_sent += 1;
        self.send_snapshot_chunk(peer, 0);
    }

    /// Leader: the chunk of our snapshot's data that starts at `offset`.
    fn send_snapshot_chunk(&mut self, peer: NodeId, offset: u64) {
        let Some(s) = self.snapshot.as_ref() else {
            return;
        };
        let total = s.data.len() as u64;
        let start = offset.min(total) as usize;
        let end = start
            .saturating_add(self.cfg.snapshot_chunk_bytes)
            .min(s.data.len());
        let chunk = Snapshot {
            index: s.index,
            term: s.term,
            membership: s.membership.clone(),
            data: s.data[start..end].to_vec(),
        };
        let body = Body::InstallSnapshot {
            snapshot: chunk,
            offset: start as u64,
            total,
        };
        self.send(peer, body);
    }

    /// Leader: the follower holds `received` bytes of the snapshot at
    /// `index`: send the next chunk, or start over if ours changed.
    pub(super) fn handle_snapshot_ack(&mut self, from: NodeId, index: Index, received: u64) {
        let now = self.now_ms;
        let ours = self
            .snapshot
            .as_ref()
            .map(|s| (s.index, s.data.len() as u64));
        let Some(pr) = self.progress.get_mut(&from) else {
            return;
        };
        let ReplicationState::Snapshot { index: sending, .. } = pr.state else {
            return; // a late ack: the follower was dealt with since
        };
        pr.last_active_ms = Some(now);
        match ours {
            Some((ours, total)) if ours == index && sending == index && received < total => {
                pr.become_snapshot(index, now);
                self.send_snapshot_chunk(from, received);
            }
            Some((ours, _)) if ours != index || sending != index => self.send_snapshot(from),
            _ => {} // complete: its AppendResponse moves the follower on
        }
    }

    /// Follower: InstallSnapshot receiver (thesis figure 5.3), one chunk
    /// at a time. Chunks are taken in order only: a gap, or a chunk of a
    /// snapshot other than the one being received, is answered with what
    /// is held, and the leader resends from there. Once whole, it is
    /// installed as before.
    pub(super) fn handle_install_snapshot(
        &mut self,
        from: NodeId,
        chunk: Snapshot,
        offset: u64,
        total: u64,
    ) {
        if !self.follow(from) {
            return;
        }
        let (index, term) = (chunk.index, chunk.term);
        if offset == 0 {
            self.snapshot_receiving = None;
            if self.already_has(from, index, term) {
                return;
            }
        }
        let receiving = match self.snapshot_receiving.take() {
            Some(r) if r.index == index && r.term == term => Some(r),
            _ if offset == 0 => Some(Snapshot {
                data: Vec::new(),
                ..chunk.clone()
            }),
            _ => None,
        };
        let Some(mut receiving) = receiving else {
            self.send(from, Body::SnapshotAck { index, received: 0 });
            return;
        };
        let held = receiving.data.len() as u64;
        let fits = held
            .checked_add(chunk.data.len() as u64)
            .is_some_and(|n| n <= total);
        if offset != held || !fits {
            self.send(
                from,
                Body::SnapshotAck {
                    index,
                    received: held,
                },
            );
            self.snapshot_receiving = Some(receiving);
            return;
        }
        receiving.data.extend_from_slice(&chunk.data);
        let received = receiving.data.len() as u64;
        if received < total {
            self.snapshot_receiving = Some(receiving);
            self.send(from, Body::SnapshotAck { index, received });
            return;
        }
        self.install_snapshot(from, receiving);
    }

    /// True (and answered) if the follower needs no snapshot to `index`:
    /// it has committed that far, or holds the snapshot's last entry.
    fn already_has(&mut self, from: NodeId, index: Index, term: Term) -> bool {
        if index <= self.log.commit {
            // Already have everything it covers.
            let match_index = self.log.commit;
            self.send(
                from,
                Body::AppendResponse(AppendResult::Accepted { match_index }),
            );
            return true;
        }
        if self.log.matches(index, term) {
            // Figure 5.3 rule 6: our log already holds the snapshot's last
            // entry, so keep what follows it and just learn the commit.
            self.log.commit_to(index);
            self.send(
                from,
                Body::AppendResponse(AppendResult::Accepted { match_index: index }),
            );
            return true;
        }
        false
    }

    /// Replaces the log with a whole snapshot received from the leader.
    fn install_snapshot(&mut self, from: NodeId, snapshot: Snapshot) {
        let index = snapshot.index;
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
