//! Leadership transfer (thesis §3.10): the leader stops taking proposals,
//! brings the target up to date, then tells it to time out now; the target
//! campaigns at once and voters ignore their leader lease for it.

use super::{Body, NodeId, Raft, RaftError, Role};

/// A transfer in progress.
#[derive(Clone, Copy, Debug)]
pub(super) struct Transfer {
    pub(super) target: NodeId,
    /// Give up if the target has not taken over by then.
    pub(super) deadline_ms: u64,
    timeout_now_sent: bool,
}

impl Raft {
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
            return Err(RaftError::InvalidMembershipChange(format!(
                "node {target} is not a voter and cannot lead"
            )));
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
