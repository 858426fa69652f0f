//! Log replication (thesis §3.5) and commitment (§3.6).
//!
//! ```text
//!  leader                                   follower
//!  propose -> append to log (unstable)
//!  ready(): entries to storage ---+          
//!           Append msgs ----------|-------> consistency check, merge,
//!                                 |         ready(): entries to storage
//!  fsync done: persisted(i) ------+         fsync done, then:
//!  <------------------------------------- AppendResponse(match i)
//!  commit = highest index durable on a majority whose term is ours
//! ```
//!
//! The leader writes in parallel with sending (§10.2.1) and counts itself
//! only once its own write is durable. Appends are pipelined per follower
//! within the in-flight window, and everything proposed between two
//! `ready()` calls travels in one message per follower (batching).

use super::{
    AppendResult, Body, Entry, Index, NodeId, Payload, PlantedBug, Raft, RaftError,
    ReplicationState, Role, Term,
};

impl Raft {
    pub(super) fn check_can_propose(&self) -> Result<(), RaftError> {
        if self.role != Role::Leader {
            return Err(RaftError::NotLeader {
                leader: self.leader,
            });
        }
        if self.transfer.is_some() {
            return Err(RaftError::TransferInProgress);
        }
        Ok(())
    }

    /// Appends an entry of the current term to the leader's log.
    pub(super) fn append_as_leader(&mut self, payload: Payload) -> (Index, Term) {
        debug_assert_eq!(self.role, Role::Leader);
        let index = self.log.last_index() + 1;
        if let Payload::Membership(m) = &payload {
            self.membership_appended_as_leader(index, m.clone());
        }
        self.log.append(Entry {
            term: self.term,
            index,
            payload,
        });
        self.replication_dirty = true;
        (index, self.term)
    }

    /// Sends whatever each follower's window allows.
    pub(super) fn broadcast_append(&mut self) {
        self.replication_dirty = false;
        let peers: Vec<NodeId> = self.progress.keys().copied().collect();
        for p in peers {
            self.send_appends(p);
        }
    }

    /// Sends appends to `peer` until its window closes or it is up to date.
    pub(super) fn send_appends(&mut self, peer: NodeId) {
        while self.send_one_append(peer) {}
    }

    fn send_one_append(&mut self, peer: NodeId) -> bool {
        let (max_msgs, max_bytes) = (self.cfg.inflight_msgs_max, self.cfg.inflight_bytes_max);
        let Some(pr) = self.progress.get(&peer) else {
            return false;
        };
        if pr.is_paused(max_msgs, max_bytes) {
            return false;
        }
        let next = pr.next_index;
        let replicating = pr.state == ReplicationState::Replicate;
        let prev_index = next - 1;
        let Some(prev_term) = self.log.term(prev_index) else {
            // The entries it needs are compacted away (§5.3).
            self.send_snapshot(peer);
            return false;
        };
        let entries = self
            .log
            .slice(next, self.log.last_index(), self.cfg.append_bytes_max);
        if entries.is_empty() && replicating {
            return false; // up to date; heartbeats keep it company
        }
        let last = entries.last().map_or(prev_index, |e| e.index);
        let bytes: usize = entries.iter().map(Entry::size_bytes).sum();
        let pr = self.progress.get_mut(&peer).expect("checked above");
        pr.sent(last, bytes);
        let commit = self.log.commit;
        self.send(
            peer,
            Body::Append {
                prev_index,
                prev_term,
                entries,
                commit,
            },
        );
        // In Probe state one message is outstanding at most.
        replicating
    }

    /// Sends a heartbeat to every peer.
    pub(super) fn broadcast_heartbeat(&mut self, read_round: u64) {
        let peers: Vec<(NodeId, Index)> = self
            .progress
            .iter()
            .map(|(&p, pr)| (p, pr.match_index))
            .collect();
        for (p, match_index) in peers {
            let commit = self.log.commit.min(match_index);
            self.send(p, Body::Heartbeat { commit, read_round });
        }
    }

    /// Accepts the authority of `from` for the current term: a candidate
    /// that hears from the elected leader becomes its follower.
    /// Returns false if this node is itself the leader of this term, which
    /// election safety says cannot happen (the simulator checks it).
    pub(super) fn follow(&mut self, from: NodeId) -> bool {
        if self.role == Role::Leader {
            return false;
        }
        if self.role != Role::Follower {
            self.become_follower(self.term, Some(from));
        }
        self.leader = Some(from);
        self.leader_contact_ms = Some(self.now_ms);
        self.reset_election_deadline();
        true
    }

    /// AppendEntries receiver (thesis figure 3.1).
    pub(super) fn handle_append(
        &mut self,
        from: NodeId,
        mut prev_index: Index,
        mut prev_term: Term,
        mut entries: Vec<Entry>,
        leader_commit: Index,
    ) {
        if !self.follow(from) {
            return;
        }
        if prev_index < self.log.commit {
            // Everything up to our commit index matches the leader (log
            // matching + leader completeness), so skip that part; this also
            // covers a prev_index already compacted into our snapshot.
            let commit = self.log.commit;
            entries.retain(|e| e.index > commit);
            prev_index = commit;
            prev_term = self.log.term(commit).expect("commit index is held");
            if entries.first().is_some_and(|e| e.index != commit + 1) {
                entries.clear();
            }
        }
        if !self.log.matches(prev_index, prev_term) {
            let probe = prev_index.min(self.log.last_index());
            let (hint_index, hint_term) = self.log.find_conflict_by_term(probe, prev_term);
            self.send(
                from,
                Body::AppendResponse(AppendResult::Rejected {
                    rejected_index: prev_index,
                    hint_index,
                    hint_term,
                }),
            );
            return;
        }
        let carries_membership = entries
            .iter()
            .any(|e| matches!(e.payload, Payload::Membership(_)));
        let old_last = self.log.last_index();
        let last_new = self.log.merge(prev_index, entries);
        if carries_membership || self.log.last_index() < old_last {
            self.rebuild_memberships_after(prev_index);
        }
        self.log.commit_to(leader_commit.min(last_new));
        self.send(
            from,
            Body::AppendResponse(AppendResult::Accepted {
                match_index: last_new,
            }),
        );
    }

    /// Heartbeat receiver: keeps the leader lease and advances commit.
    pub(super) fn handle_heartbeat(&mut self, from: NodeId, commit: Index, read_round: u64) {
        if !self.follow(from) {
            return;
        }
        self.log.commit_to(commit.min(self.log.last_index()));
        self.send(from, Body::HeartbeatResponse { read_round });
    }

    /// Leader: a follower answered an append or a snapshot.
    pub(super) fn handle_append_response(&mut self, from: NodeId, result: AppendResult) {
        if self.role != Role::Leader {
            return;
        }
        let now = self.now_ms;
        let Some(pr) = self.progress.get_mut(&from) else {
            return;
        };
        pr.last_active_ms = Some(now);
        match result {
            AppendResult::Accepted { match_index } => {
                if match_index > self.log.last_index() {
                    return; // cannot match entries we never had: ignore
                }
                if pr.acknowledged(match_index) {
                    self.maybe_commit();
                }
                self.maybe_send_timeout_now(from);
            }
            AppendResult::Rejected {
                rejected_index,
                hint_index,
                hint_term,
            } => {
                let probe_from = self.log.find_conflict_by_term(hint_index, hint_term).0 + 1;
                let pr = self.progress.get_mut(&from).expect("present");
                if !pr.rejected(rejected_index, probe_from) {
                    return;
                }
            }
        }
        if self.role == Role::Leader {
            self.send_appends(from);
        }
    }

    /// Leader: a follower answered a heartbeat. Restarts stalled probes and
    /// snapshots, and counts towards read-index rounds.
    pub(super) fn handle_heartbeat_response(&mut self, from: NodeId, read_round: u64) {
        if self.role != Role::Leader {
            return;
        }
        let last = self.log.last_index();
        let resend_after_ms = self.cfg.election_timeout_ms;
        let now = self.now_ms;
        let (max_msgs, max_bytes) = (self.cfg.inflight_msgs_max, self.cfg.inflight_bytes_max);
        let Some(pr) = self.progress.get_mut(&from) else {
            return;
        };
        pr.last_active_ms = Some(now);
        match pr.state {
            ReplicationState::Probe => pr.probe_sent = false,
            ReplicationState::Replicate => {
                if pr.match_index < last && pr.is_paused(max_msgs, max_bytes) {
                    pr.free_oldest_inflight();
                }
            }
            ReplicationState::Snapshot { sent_ms, .. } => {
                if now >= sent_ms + resend_after_ms {
                    pr.become_probe(); // the snapshot was probably lost
                }
            }
        }
        if pr.match_index < last {
            self.send_appends(from);
            self.probe_sent_tail(from);
        }
        if read_round != 0 {
            self.read_round_acked(from, read_round);
        }
    }

    /// Replicate state with everything sent but not all acknowledged: the
    /// appends may have been lost (a partition, a follower that crashed
    /// before syncing them), and nothing new is proposed to carry the gap.
    /// An empty append at the last index sent is cheap; a follower that
    /// lacks that index rejects it, which restarts probing from what it has
    /// (thesis §3.5: the leader retries AppendEntries until every follower
    /// stores every entry).
    fn probe_sent_tail(&mut self, peer: NodeId) {
        let (max_msgs, max_bytes) = (self.cfg.inflight_msgs_max, self.cfg.inflight_bytes_max);
        let last = self.log.last_index();
        let Some(pr) = self.progress.get_mut(&peer) else {
            return;
        };
        let everything_sent = pr.state == ReplicationState::Replicate && pr.next_index > last;
        if !everything_sent || pr.match_index >= last || pr.is_paused(max_msgs, max_bytes) {
            return;
        }
        let prev_index = pr.next_index - 1;
        let Some(prev_term) = self.log.term(prev_index) else {
            return;
        };
        pr.sent(prev_index, 0);
        let commit = self.log.commit;
        self.send(
            peer,
            Body::Append {
                prev_index,
                prev_term,
                entries: Vec::new(),
                commit,
            },
        );
    }

    /// Advances the commit index to the highest index durable on a majority
    /// of voters, if that entry is of the current term (thesis §3.6.2: a
    /// leader never commits an earlier term's entry by counting replicas).
    pub(super) fn maybe_commit(&mut self) {
        // Runs on every acknowledgement: borrow the membership, don't copy it.
        let quorum = self.membership().quorum();
        let mut matched: Vec<Index> = self
            .membership()
            .voters
            .iter()
            .map(|&v| {
                if v == self.id {
                    self.log.persisted
                } else {
                    self.progress.get(&v).map_or(0, |p| p.match_index)
                }
            })
            .collect();
        matched.sort_unstable_by(|a, b| b.cmp(a));
        let mut candidate = matched[quorum - 1];
        if self.cfg.planted_bug == Some(PlantedBug::CommitOnLeaderOnly) {
            candidate = self.log.persisted;
        }
        if candidate > self.log.commit && self.log.term(candidate) == Some(self.term) {
            self.log.commit_to(candidate);
            self.committed_in_current_term();
        }
    }
}
