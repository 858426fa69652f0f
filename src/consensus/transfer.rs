//! Leadership transfer (thesis §3.10): the leader stops taking proposals,
//! brings the target up to date, then tells it to time out now; the target
//! campaigns at once and voters ignore their leader lease for it.

use super::{Body, MembershipError, NodeId, Raft, RaftError, ReplicationState, Role};

/// The most times the hold before a handover to the preferred voter
/// doubles (after failed handovers, or leaderships won again): 64×.
const PREFERRED_HOLD_DOUBLINGS_MAX: u32 = 6;

/// A transfer in progress.
#[derive(Clone, Copy, Debug)]
pub(super) struct Transfer {
    pub(super) target: NodeId,
    /// Give up if the target has not taken over by then.
    pub(super) deadline_ms: u64,
    timeout_now_sent: bool,
}

impl Raft {
    /// The voter this group prefers as leader
    /// ([`RaftConfig::preferred_leader_rank`](super::RaftConfig)), if any.
    pub fn preferred_leader(&self) -> Option<NodeId> {
        let rank = self.cfg.preferred_leader_rank?;
        let voters = &self.membership().voters;
        let len = voters.len() as u64;
        if len == 0 {
            return None;
        }
        voters.iter().nth((rank % len) as usize).copied()
    }

    /// Hands leadership to `target`, a voter. Proposals are refused until
    /// the transfer completes or times out (one election timeout).
    pub fn transfer_leadership(&mut self, target: NodeId) -> Result<(), RaftError> {
        if self.role != Role::Leader {
            return Err(RaftError::NotLeader {
                leader: self.leader,
            });
        }
        if target == self.id {
            return Ok(());
        }
        if !self.membership().voters.contains(&target) {
            return Err(RaftError::InvalidMembershipChange(
                MembershipError::NotVoter(target),
            ));
        }
        if self.transfer.is_some_and(|t| t.target == target) {
            return Ok(());
        }
        self.transfer = Some(Transfer {
            target,
            deadline_ms: self.now_ms + self.cfg.election_timeout_ms,
            timeout_now_sent: false,
        });
        self.maybe_send_timeout_now(target);
        self.send_appends(target);
        Ok(())
    }

    /// The target of a transfer in progress, if any.
    pub fn transfer_target(&self) -> Option<NodeId> {
        self.transfer.map(|t| t.target)
    }

    /// Leader, just elected: the hold starts from `preferred_leader_hold_ms`,
    /// doubled for each other time this node became leader within the
    /// longest hold (the preferred voter took over and failed again).
    pub(super) fn preferred_hold_on_election(&mut self) {
        let base = self.cfg.preferred_leader_hold_ms;
        let window = base << PREFERRED_HOLD_DOUBLINGS_MAX;
        let now = self.now_ms;
        let won = &mut self.leaderships_won_ms;
        while won
            .front()
            .is_some_and(|&t| now >= t.saturating_add(window))
        {
            won.pop_front();
        }
        if won.len() > PREFERRED_HOLD_DOUBLINGS_MAX as usize {
            won.pop_front();
        }
        won.push_back(now);
        self.preferred_hold_ms = base << (won.len() - 1);
        self.preferred_answering_since_ms = None;
    }

    /// Leader: the transfer in progress did not complete in time. A
    /// handover to the preferred voter waits twice as long next time.
    pub(super) fn transfer_timed_out(&mut self) {
        let Some(t) = self.transfer.take() else {
            return;
        };
        if Some(t.target) == self.preferred_leader() {
            self.stats.preferred_leader_transfers_failed += 1;
            let ceiling = self.cfg.preferred_leader_hold_ms << PREFERRED_HOLD_DOUBLINGS_MAX;
            self.preferred_hold_ms = (self.preferred_hold_ms * 2).min(ceiling);
            self.preferred_answering_since_ms = None;
        }
    }

    /// Leader timers (`tick_leader`): hands leadership to the preferred
    /// voter once it has answered within every election timeout for the
    /// hold and caught up, with no transfer or membership change under way.
    pub(super) fn tick_preferred_leader(&mut self) {
        let Some(preferred) = self.preferred_leader().filter(|&p| p != self.id) else {
            return;
        };
        let now = self.now_ms;
        let Some(p) = self.progress.get(&preferred) else {
            return;
        };
        let answering = p
            .last_active_ms
            .is_some_and(|t| now < t + self.cfg.election_timeout_ms);
        // A voter still catching up (probing, a snapshot on its way, or
        // short of the commit index) would hold proposals off for the
        // whole transfer: wait until it streams and has what is committed.
        let caught_up = p.state == ReplicationState::Replicate && p.match_index >= self.log.commit;
        if !answering {
            self.preferred_answering_since_ms = None;
            return;
        }
        let since = *self.preferred_answering_since_ms.get_or_insert(now);
        let busy = self.transfer.is_some() || self.pending_membership_index > self.log.commit;
        if busy || !caught_up || now < since + self.preferred_hold_ms {
            return;
        }
        self.preferred_answering_since_ms = None;
        if self.transfer_leadership(preferred).is_ok() {
            self.stats.preferred_leader_transfers += 1;
        }
    }

    /// Sends TimeoutNow once the transfer target's log is complete.
    pub(super) fn maybe_send_timeout_now(&mut self, peer: NodeId) {
        let last = self.log.last_index();
        let Some(t) = self.transfer.as_mut() else {
            return;
        };
        if t.target != peer || t.timeout_now_sent {
            return;
        }
        if self
            .progress
            .get(&peer)
            .is_some_and(|p| p.match_index == last)
        {
            t.timeout_now_sent = true;
            self.send(peer, Body::TimeoutNow);
        }
    }

    /// The leader asks us to take over.
    pub(super) fn handle_timeout_now(&mut self, from: NodeId) {
        if self.role != Role::Leader && self.promotable() && self.leader == Some(from) {
            self.start_election(true);
        }
    }
}
