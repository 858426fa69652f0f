//! Single-server membership changes (thesis §4.1–§4.2): a new membership
//! takes effect as soon as its entry is in the log, one change at a time;
//! learners catch up before they vote (§4.2.1); a leader that removed
//! itself steps down once the change is committed (§4.2.2).

use super::{Index, Membership, MembershipChange, Payload, Progress, Raft, RaftError, Term};

impl Raft {
    /// Proposes adding or removing one member. Returns the index and term
    /// of the membership entry; only one may be uncommitted at a time.
    pub fn propose_membership(
        &mut self,
        change: MembershipChange,
    ) -> Result<(Index, Term), RaftError> {
        self.check_can_propose()?;
        if self.pending_membership_index > self.log.commit {
            return Err(RaftError::MembershipChangePending);
        }
        let next = self
            .membership()
            .apply(change)
            .map_err(RaftError::InvalidMembershipChange)?;
        Ok(self.append_as_leader(Payload::Membership(next)))
    }

    /// The membership in force at `index`.
    pub(super) fn membership_at(&self, index: Index) -> Membership {
        self.memberships
            .range(..=index)
            .next_back()
            .map(|(_, m)| m.clone())
            .expect("the snapshot's membership is always known")
    }

    /// Leader: a membership entry was appended at `index`; it is in force
    /// now, so start or stop replicating to the members it changes.
    pub(super) fn membership_appended_as_leader(&mut self, index: Index, m: Membership) {
        for member in m.members() {
            if member != self.id && !self.progress.contains_key(&member) {
                self.progress.insert(member, Progress::new(index));
            }
        }
        self.progress.retain(|id, _| m.contains(*id));
        self.memberships.insert(index, m);
        self.pending_membership_index = index;
    }

    /// Follower: the log changed after `from_index` (entries replaced or
    /// added); re-read the membership entries there.
    pub(super) fn rebuild_memberships_after(&mut self, from_index: Index) {
        self.memberships.split_off(&(from_index + 1));
        let found: Vec<(Index, Membership)> = self
            .log
            .iter_from(from_index + 1)
            .filter_map(|e| match &e.payload {
                Payload::Membership(m) => Some((e.index, m.clone())),
                _ => None,
            })
            .collect();
        self.memberships.extend(found);
    }

    /// Called whenever the leader's commit index advanced in its own term.
    pub(super) fn committed_in_current_term(&mut self) {
        self.release_reads_waiting_for_commit();
        let removed = !self.membership().voters.contains(&self.id);
        if removed && self.log.commit >= self.pending_membership_index {
            // §4.2.2: the leader managed the cluster until its removal was
            // committed; the remaining voters elect a new leader.
            self.become_follower(self.term, None);
        }
    }
}
