//! The vocabulary of the consensus core: ids, log entries, messages, hard
//! state, snapshots and membership. Plain data, no behaviour beyond sizes.

use std::collections::BTreeSet;

/// Identifies a node (host) of the cluster; never 0.
pub type NodeId = u64;
/// A Raft term (thesis §3.3).
pub type Term = u64;
/// A position in the replicated log; the first entry has index 1.
pub type Index = u64;

/// The voting and non-voting members of a group (thesis §4.1).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Membership {
    /// Members whose acknowledgements count towards commit and elections.
    pub voters: BTreeSet<NodeId>,
    /// Members that receive the log but neither vote nor count (thesis §4.2.1).
    pub learners: BTreeSet<NodeId>,
}

impl Membership {
    /// A membership made of the given voters and no learners.
    pub fn with_voters(voters: impl IntoIterator<Item = NodeId>) -> Self {
        Membership {
            voters: voters.into_iter().collect(),
            learners: BTreeSet::new(),
        }
    }

    /// Votes needed for a majority of the voters.
    pub fn quorum(&self) -> usize {
        self.voters.len() / 2 + 1
    }

    /// True if `id` is a voter or a learner.
    pub fn contains(&self, id: NodeId) -> bool {
        self.voters.contains(&id) || self.learners.contains(&id)
    }

    /// Every member, voters first.
    pub fn members(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.voters.iter().chain(self.learners.iter()).copied()
    }

    /// The membership that results from applying one single-server change
    /// (thesis §4.1: one server at a time keeps old and new majorities
    /// overlapping), or why the change makes no sense here.
    pub fn apply(&self, change: MembershipChange) -> Result<Membership, MembershipError> {
        let mut next = self.clone();
        match change {
            MembershipChange::AddVoter(id) => {
                if next.voters.contains(&id) {
                    return Err(MembershipError::AlreadyVoter(id));
                }
                next.learners.remove(&id);
                next.voters.insert(id);
            }
            MembershipChange::AddLearner(id) => {
                if next.contains(id) {
                    return Err(MembershipError::AlreadyMember(id));
                }
                next.learners.insert(id);
            }
            MembershipChange::Remove(id) => {
                if !next.contains(id) {
                    return Err(MembershipError::NotMember(id));
                }
                next.voters.remove(&id);
                next.learners.remove(&id);
                if next.voters.is_empty() {
                    return Err(MembershipError::LastVoter);
                }
            }
        }
        Ok(next)
    }
}

/// Why a membership change (or a leadership transfer) makes no sense for
/// the membership in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MembershipError {
    /// Adding as a voter a node that already is one.
    AlreadyVoter(NodeId),
    /// Adding as a learner a node that is already a member.
    AlreadyMember(NodeId),
    /// Removing a node that is not a member.
    NotMember(NodeId),
    /// Removing the last voter: the group would have no quorum.
    LastVoter,
    /// Handing leadership to a node that is not a voter.
    NotVoter(NodeId),
}

impl std::fmt::Display for MembershipError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MembershipError::AlreadyVoter(id) => write!(f, "node {id} is already a voter"),
            MembershipError::AlreadyMember(id) => write!(f, "node {id} is already a member"),
            MembershipError::NotMember(id) => write!(f, "node {id} is not a member"),
            MembershipError::LastVoter => {
                write!(
                    f,
                    "removing the last voter would leave the group without a quorum"
                )
            }
            MembershipError::NotVoter(id) => {
                write!(f, "node {id} is not a voter and cannot lead")
            }
        }
    }
}

impl std::error::Error for MembershipError {}

/// One single-server membership change (thesis §4.1, §4.2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MembershipChange {
    /// Add a voter, or promote an existing learner to voter.
    AddVoter(NodeId),
    /// Add a non-voting learner that catches up before promotion.
    AddLearner(NodeId),
    /// Remove a voter or learner.
    Remove(NodeId),
}

impl std::fmt::Display for MembershipChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MembershipChange::AddVoter(n) => write!(f, "add voter {n}"),
            MembershipChange::AddLearner(n) => write!(f, "add learner {n}"),
            MembershipChange::Remove(n) => write!(f, "remove node {n}"),
        }
    }
}

/// What a log entry carries.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Payload {
    /// The empty entry a new leader appends to commit its term (thesis §6.4).
    Noop,
    /// Application data: a batch of client records, opaque to the core.
    /// Shared, not copied: the log, the WAL's writes, the messages to each
    /// follower and the applier hold the one buffer.
    Normal(bytes::Bytes),
    /// The complete membership in force from this entry on (thesis §4.1).
    Membership(Membership),
}

/// One entry of the replicated log.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// Term of the leader that created the entry.
    pub term: Term,
    /// Position in the log.
    pub index: Index,
    /// Contents.
    pub payload: Payload,
}

/// Fixed per-entry overhead counted by flow control, in bytes.
pub const ENTRY_OVERHEAD_BYTES: usize = 24;

impl Entry {
    /// Approximate encoded size, used for batching and flow-control windows.
    pub fn size_bytes(&self) -> usize {
        ENTRY_OVERHEAD_BYTES
            + match &self.payload {
                Payload::Noop => 0,
                Payload::Normal(data) => data.len(),
                Payload::Membership(m) => 8 * (m.voters.len() + m.learners.len()),
            }
    }
}

/// The state that must be on stable storage before messages depending on it
/// are sent (thesis §3.8 and figure 3.1, "persistent state on all servers").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HardState {
    /// Latest term this node has seen.
    pub term: Term,
    /// Candidate voted for in `term`, if any.
    pub vote: Option<NodeId>,
    /// Highest index known committed; persisted lazily, never decreases.
    pub commit: Index,
}

/// A state-machine snapshot and the log position it replaces (thesis §5.1).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Snapshot {
    /// Last log index the snapshot covers.
    pub index: Index,
    /// Term of the entry at `index`.
    pub term: Term,
    /// Membership in force at `index`.
    pub membership: Membership,
    /// The state machine's own encoding of its state; opaque to the core.
    pub data: Vec<u8>,
}

impl Snapshot {
    /// Approximate encoded size in bytes.
    pub fn size_bytes(&self) -> usize {
        32 + 8 * (self.membership.voters.len() + self.membership.learners.len()) + self.data.len()
    }
}

/// A message between two replicas of the same group.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Message {
    /// Sender.
    pub from: NodeId,
    /// Receiver.
    pub to: NodeId,
    /// Sender's term, or for a pre-vote the term it would campaign in.
    pub term: Term,
    /// What the message says.
    pub body: Body,
}

/// Message bodies (thesis figure 3.1, §4.2.3 pre-vote, §3.10 transfer,
/// §6.4 read-index, §5.3 snapshots).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Body {
    /// "Would you vote for me in `term`?" without disturbing anyone (§9.6).
    PreVote {
        /// Candidate's last log index.
        last_index: Index,
        /// Candidate's last log term.
        last_term: Term,
    },
    /// Answer to a pre-vote.
    PreVoteResponse {
        /// True if the pre-vote was granted.
        granted: bool,
    },
    /// RequestVote RPC.
    Vote {
        /// Candidate's last log index.
        last_index: Index,
        /// Candidate's last log term.
        last_term: Term,
        /// True when the election was started by a leadership transfer, so
        /// voters must ignore their leader lease (§3.10).
        transfer: bool,
    },
    /// Answer to RequestVote.
    VoteResponse {
        /// True if the vote was granted.
        granted: bool,
    },
    /// AppendEntries RPC carrying entries.
    Append {
        /// Index of the entry before `entries`.
        prev_index: Index,
        /// Term of the entry at `prev_index`.
        prev_term: Term,
        /// New entries, consecutive from `prev_index + 1`.
        entries: Vec<Entry>,
        /// Leader's commit index.
        commit: Index,
    },
    /// Answer to AppendEntries or InstallSnapshot.
    AppendResponse(AppendResult),
    /// Empty AppendEntries: keeps the leader's authority and carries the
    /// read-index round (§6.4). `commit` is capped at what the follower is
    /// known to hold, so it never commits entries it might not match.
    Heartbeat {
        /// min(leader commit, follower match).
        commit: Index,
        /// Read-index round this heartbeat confirms; 0 for none.
        read_round: u64,
    },
    /// Answer to a heartbeat.
    HeartbeatResponse {
        /// Echo of the heartbeat's read round.
        read_round: u64,
    },
    /// InstallSnapshot RPC (thesis figure 5.3), one chunk of the data: the
    /// leader's latest snapshot with `data` holding bytes `offset..` of
    /// its whole data, `total` bytes long. Chunks are bounded by
    /// `snapshot_chunk_bytes`, so a snapshot of any size fits the
    /// transport's message limit; the leader sends the next chunk once the
    /// follower acknowledges this one (stop and wait: flow control).
    InstallSnapshot {
        /// The snapshot's metadata, and this chunk as `data`.
        snapshot: Snapshot,
        /// Where the chunk starts in the whole data.
        offset: u64,
        /// Bytes of the whole data.
        total: u64,
    },
    /// A follower holds the first `received` bytes of the snapshot at
    /// `index`: send from there (0: start over).
    SnapshotAck {
        /// The snapshot's index.
        index: Index,
        /// Bytes of its data received in order.
        received: u64,
    },
    /// "Start an election now": leadership transfer (§3.10).
    TimeoutNow,
    /// Carried for the replica, never read by Raft (which drops it before
    /// looking at its term): "send me your committed copies of these
    /// entries", from a replica whose copies of entries its state refers
    /// to are damaged or lost (`node::replica::repair`). At most
    /// [`REPAIR_INDEXES_MAX`] indexes, ascending.
    RepairRequest {
        /// The entries wanted.
        indexes: Vec<Index>,
    },
    /// Carried for the replica, never read by Raft: the answer to a
    /// [`Body::RepairRequest`], the sender's committed copies of some of
    /// the entries asked for and the indexes it holds no copy of (those
    /// it could not read at once it leaves out; the asker asks again).
    RepairEntries {
        /// Committed entries, ascending by index.
        entries: Vec<Entry>,
        /// Indexes asked for that the sender does not hold.
        not_held: Vec<Index>,
    },
}

impl Body {
    /// Whether Raft leaves it to the replica (the repair messages).
    pub fn is_for_the_replica(&self) -> bool {
        matches!(
            self,
            Body::RepairRequest { .. } | Body::RepairEntries { .. }
        )
    }
}

/// Indexes one [`Body::RepairRequest`] asks for at most (and one
/// [`Body::RepairEntries`] lists as not held).
pub const REPAIR_INDEXES_MAX: usize = 256;

/// Outcome of an append or snapshot install at a follower.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AppendResult {
    /// The follower's log matches the leader's up to `match_index`, durably.
    Accepted {
        /// Highest index known to match and be durable.
        match_index: Index,
    },
    /// The follower's log does not contain `prev_index` with `prev_term`.
    Rejected {
        /// The `prev_index` that failed to match.
        rejected_index: Index,
        /// The follower's hint: the largest index at or below the rejected
        /// one whose term is at most the rejected `prev_term` (§5.3's
        /// fast back-off).
        hint_index: Index,
        /// Term of the entry at `hint_index` in the follower's log.
        hint_term: Term,
    },
}

/// The role of a replica (thesis figure 3.3, plus pre-candidate from §9.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Passive; answers leaders and candidates.
    Follower,
    /// Asking for pre-votes; has not bumped its term.
    PreCandidate,
    /// Asking for votes in a new term.
    Candidate,
    /// Accepts proposals and replicates them.
    Leader,
}

/// A linearizable read that may be served once the state machine has
/// applied `index` (thesis §6.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReadState {
    /// The caller's request id, as passed to `read_index`.
    pub request_id: u64,
    /// The commit index the read must wait for.
    pub index: Index,
}
