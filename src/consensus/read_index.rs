//! Linearizable reads without writing to the log (thesis §6.4): the leader
//! notes its commit index, confirms with a heartbeat round that a majority
//! still follows it, and the read may be served once that index is applied.

use super::{Body, Raft, RaftError, ReadState, Role};
use std::collections::{BTreeSet, VecDeque};

#[derive(Debug)]
struct PendingRead {
    round: u64,
    request_id: u64,
    index: u64,
    acks: BTreeSet<u64>,
}

/// Reads waiting for their heartbeat round, oldest first.
#[derive(Debug, Default)]
pub(super) struct ReadIndexQueue {
    last_round: u64,
    rounds: VecDeque<PendingRead>,
    /// Requests that arrived before the leader committed in its term.
    waiting_for_commit: Vec<u64>,
}

impl ReadIndexQueue {
    /// The round heartbeats should carry (0: none pending).
    pub(super) fn latest_round(&self) -> u64 {
        if self.rounds.is_empty() {
            0
        } else {
            self.last_round
        }
    }

    pub(super) fn clear(&mut self) {
        self.rounds.clear();
        self.waiting_for_commit.clear();
    }
}

impl Raft {
    /// Asks for a linearizable read. On the leader the answer arrives as a
    /// [`ReadState`] in a later `Ready`; elsewhere it is refused so the
    /// caller can redirect.
    pub fn read_index(&mut self, request_id: u64) -> Result<(), RaftError> {
        if self.role != Role::Leader {
            return Err(RaftError::NotLeader {
                leader: self.leader,
            });
        }
        // §6.4 step 1: until an entry of its own term is committed, the
        // leader does not know the latest commit index.
        if self.log.term(self.log.commit) != Some(self.term) {
            self.reads.waiting_for_commit.push(request_id);
            return Ok(());
        }
        self.start_read_round(request_id);
        Ok(())
    }

    fn start_read_round(&mut self, request_id: u64) {
        let index = self.log.commit;
        if self.membership().voters.len() == 1 && self.membership().voters.contains(&self.id) {
            self.read_states.push(ReadState { request_id, index });
            return;
        }
        self.reads.last_round += 1;
        let round = self.reads.last_round;
        let mut acks = BTreeSet::new();
        acks.insert(self.id);
        self.reads.rounds.push_back(PendingRead {
            round,
            request_id,
            index,
            acks,
        });
        let peers: Vec<u64> = self.progress.keys().copied().collect();
        for p in peers {
            let commit = self.log.commit.min(self.progress[&p].match_index);
            self.send(
                p,
                Body::Heartbeat {
                    commit,
                    read_round: round,
                },
            );
        }
    }

    pub(super) fn release_reads_waiting_for_commit(&mut self) {
        for id in std::mem::take(&mut self.reads.waiting_for_commit) {
            self.start_read_round(id);
        }
    }

    /// A heartbeat answer for `round` also vouches for every earlier round:
    /// the follower still recognised us after those reads were registered.
    pub(super) fn read_round_acked(&mut self, from: u64, round: u64) {
        for r in self.reads.rounds.iter_mut() {
            if r.round <= round {
                r.acks.insert(from);
            }
        }
        let quorum = self.membership().quorum();
        while let Some(front) = self.reads.rounds.front() {
            let votes = front
                .acks
                .iter()
                .filter(|a| self.membership().voters.contains(a))
                .count();
            if votes < quorum {
                break;
            }
            let r = self.reads.rounds.pop_front().expect("front exists");
            self.read_states.push(ReadState {
                request_id: r.request_id,
                index: r.index,
            });
        }
    }
}
