//! What a leader knows about each follower: how far it matches, what to
//! send next, and how much is in flight. The in-flight window (messages and
//! bytes) is the consensus half of flow control; the transport's window is
//! the other half.

use super::types::Index;
use std::collections::VecDeque;

/// How the leader is currently replicating to one follower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicationState {
    /// The follower's position is unknown: send one append at a time and
    /// wait for its answer (or the next heartbeat) before the next.
    Probe,
    /// The follower is known to match: stream appends optimistically,
    /// bounded by the in-flight window (pipelining, thesis §10.2.1).
    Replicate,
    /// The follower needs entries the leader has compacted: a snapshot to
    /// `index` is on its way, sent at `sent_ms`.
    Snapshot {
        /// Index of the snapshot sent.
        index: Index,
        /// When its last chunk was sent, for resending if it was lost.
        sent_ms: u64,
    },
}

/// One follower's replication progress, as seen by the leader.
#[derive(Clone, Debug)]
pub struct Progress {
    /// Highest index known to be durably replicated on the follower.
    pub match_index: Index,
    /// Next index to send.
    pub next_index: Index,
    /// Current replication mode.
    pub state: ReplicationState,
    /// In `Probe`: an append is outstanding, wait for an answer.
    pub probe_sent: bool,
    /// When the follower last answered an append or heartbeat: check-quorum
    /// (thesis §6.2) counts it while that is less than an election timeout
    /// ago.
    pub last_active_ms: Option<u64>,
    /// Appends in flight: (last index carried, bytes), oldest first.
    inflight: VecDeque<(Index, usize)>,
    inflight_bytes: usize,
}

impl Progress {
    /// A follower whose position is unknown; probing starts at `next_index`.
    pub fn new(next_index: Index) -> Self {
        Progress {
            match_index: 0,
            next_index,
            state: ReplicationState::Probe,
            probe_sent: false,
            last_active_ms: None,
            inflight: VecDeque::new(),
            inflight_bytes: 0,
        }
    }

    /// True if nothing more may be sent now.
    pub fn is_paused(&self, max_msgs: usize, max_bytes: usize) -> bool {
        match self.state {
            ReplicationState::Probe => self.probe_sent,
            ReplicationState::Replicate => {
                self.inflight.len() >= max_msgs || self.inflight_bytes >= max_bytes
            }
            ReplicationState::Snapshot { .. } => true,
        }
    }

    /// Records an append carrying entries up to `last` (`bytes` long).
    pub fn sent(&mut self, last: Index, bytes: usize) {
        match self.state {
            ReplicationState::Replicate => {
                self.next_index = last + 1;
                self.inflight.push_back((last, bytes));
                self.inflight_bytes += bytes;
            }
            ReplicationState::Probe => self.probe_sent = true,
            ReplicationState::Snapshot { .. } => unreachable!("no appends while snapshotting"),
        }
    }

    /// The follower matches up to `index`. Returns true if that is news.
    pub fn acknowledged(&mut self, index: Index) -> bool {
        let news = index > self.match_index;
        if news {
            self.match_index = index;
        }
        self.next_index = self.next_index.max(index + 1);
        while let Some(&(last, bytes)) = self.inflight.front() {
            if last > index {
                break;
            }
            self.inflight.pop_front();
            self.inflight_bytes -= bytes;
        }
        match self.state {
            ReplicationState::Probe => {
                self.probe_sent = false;
                self.become_replicate();
            }
            ReplicationState::Snapshot { index: snap, .. } if self.match_index >= snap => {
                self.become_replicate();
            }
            _ => {}
        }
        news
    }

    /// The follower rejected an append at `rejected`; its hint says where
    /// to probe next. Returns false for stale rejections.
    pub fn rejected(&mut self, rejected: Index, probe_from: Index) -> bool {
        match self.state {
            ReplicationState::Replicate => {
                if rejected <= self.match_index {
                    return false; // an old message, answered already
                }
                self.become_probe();
                self.next_index = (self.match_index + 1).max(probe_from.min(rejected));
                true
            }
            ReplicationState::Probe => {
                if self.next_index == 0 || rejected != self.next_index - 1 {
                    return false; // answer to an earlier probe
                }
                if rejected <= self.match_index {
                    // The follower no longer holds entries it acknowledged:
                    // recovery found them damaged and it is repairing (it
                    // does not vote meanwhile). Lowering match only delays
                    // commits; commit itself never goes back.
                    self.match_index = probe_from.min(rejected).saturating_sub(1);
                }
                self.next_index = (self.match_index + 1).max(probe_from.min(rejected)).max(1);
                self.probe_sent = false;
                true
            }
            ReplicationState::Snapshot { .. } => false,
        }
    }

    /// Switch to streaming from `match_index + 1`.
    pub fn become_replicate(&mut self) {
        self.state = ReplicationState::Replicate;
        self.next_index = self.next_index.max(self.match_index + 1);
        self.probe_sent = false;
    }

    /// Switch to one-at-a-time probing from `match_index + 1`.
    pub fn become_probe(&mut self) {
        if let ReplicationState::Snapshot { index, .. } = self.state {
            self.next_index = (self.match_index + 1).max(index + 1);
        } else {
            self.next_index = self.match_index + 1;
        }
        self.state = ReplicationState::Probe;
        self.probe_sent = false;
        self.clear_inflight();
    }

    /// A snapshot to `index` was sent at `now_ms`.
    pub fn become_snapshot(&mut self, index: Index, now_ms: u64) {
        self.state = ReplicationState::Snapshot {
            index,
            sent_ms: now_ms,
        };
        self.probe_sent = false;
        self.clear_inflight();
    }

    /// Frees the oldest in-flight slot: a heartbeat answer while the window
    /// is full means an append was probably lost; sending one more lets the
    /// follower's rejection restart probing (etcd's `FreeFirstOne`).
    pub fn free_oldest_inflight(&mut self) {
        if let Some((_, bytes)) = self.inflight.pop_front() {
            self.inflight_bytes -= bytes;
        }
    }

    /// Number of appends in flight.
    pub fn inflight_msgs(&self) -> usize {
        self.inflight.len()
    }

    fn clear_inflight(&mut self) {
        self.inflight.clear();
        self.inflight_bytes = 0;
    }
}
