//! Raft, one instance per group, as a sans-IO state machine.
//!
//! This module does no I/O, reads no clock and uses no global randomness:
//! time arrives as `now_ms` arguments, randomness from the seed given to
//! [`Raft::new`], and everything the caller must do comes back from
//! [`Raft::ready`]. That is what lets the simulator replay a run bit for bit.
//!
//! The loop a driver runs (etcd's `Ready` loop):
//!
//! ```text
//!   inputs:  step(now, msg) | tick(now) | propose(data) | read_index(id)
//!            persisted(i, t) | applied(i) | compact(i, data) | campaign() ...
//!   then:    let rd = raft.ready();
//!            send rd.messages now (leader traffic may overlap the leader's
//!              own write: thesis §10.2.1);
//!            write rd.snapshot, rd.truncate_from/rd.entries, rd.hard_state
//!              (in that order) and fsync;
//!            after the fsync: send rd.messages_after_persist, then call
//!              persisted(last index, last term) of what was written;
//!            apply rd.committed, then call applied(i);
//!            serve rd.read_states once applied >= their index;
//!            sleep until poll_timeout(), a message, or a client request.
//! ```
//!
//! One concern per file: `election` (pre-vote, votes, check-quorum),
//! `replication` (appends, commit), `snapshot`, `membership`, `read_index`,
//! `transfer`, `progress` (per-follower window) and `log` (positions).

mod election;
mod failover;
pub mod image;
mod log;
mod membership;
mod progress;
mod read_index;
mod replication;
mod snapshot;
pub use snapshot::{ImageChunk, ImageRead};
mod transfer;
pub mod types;

pub use progress::{Progress, ReplicationState};
pub use types::*;

use log::RaftLog;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use read_index::ReadIndexQueue;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// A deliberately wrong behaviour, switched on only to show that the
/// simulator's checkers catch it. Fault injection: never enable outside
/// tests and `quire-sim --bug`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlantedBug {
    /// The leader commits as soon as its own write is durable, ignoring
    /// the followers (breaks "durable on a majority").
    CommitOnLeaderOnly,
    /// The vote is left out of the persisted hard state, so a restarted
    /// node can vote twice in one term (breaks election safety).
    ForgetVote,
    /// A follower acknowledges appended entries before they are durable,
    /// so a crash can lose entries a leader counted (breaks durability).
    AckBeforeFsync,
    /// A node whose recovery found damaged entries votes and campaigns
    /// before re-fetching them (breaks leader completeness).
    VoteWhileRepairing,
}

/// Static configuration of one Raft instance. All durations in ms.
#[derive(Clone, Debug)]
pub struct RaftConfig {
    /// This node's id (non-zero).
    pub id: NodeId,
    /// Voters of a brand-new group; empty for a node that joins an existing
    /// group and learns the membership from its leader.
    pub initial_voters: Vec<NodeId>,
    /// Minimum election timeout; the actual one is drawn from
    /// `[election_timeout_ms, 2 * election_timeout_ms)` (thesis §3.4).
    pub election_timeout_ms: u64,
    /// Interval between leader heartbeats; well below the election timeout.
    pub heartbeat_interval_ms: u64,
    /// Ask for pre-votes before bumping the term (thesis §9.6).
    pub pre_vote: bool,
    /// Leader steps down if a majority is silent for an election timeout,
    /// and voters ignore candidates while they hear from a leader (§6.2).
    pub check_quorum: bool,
    /// Append messages in flight per follower.
    pub inflight_msgs_max: usize,
    /// Bytes of entries in flight per follower.
    pub inflight_bytes_max: usize,
    /// Bytes of entries per append message (at least one entry is sent).
    pub append_bytes_max: usize,
    /// Bytes of committed entries handed out per `Ready`.
    pub apply_bytes_max: usize,
    /// Ask for a snapshot once this many applied entries follow the last one.
    pub snapshot_entries: u64,
    /// Or once this many bytes of entries (`Entry::size_bytes`) have been
    /// handed out for applying since the last ask: an entry may hold
    /// thousands of records, so a count alone would let the log in memory
    /// grow to gigabytes before a snapshot trims it.
    pub snapshot_bytes: u64,
    /// Bytes of snapshot data per InstallSnapshot message (well below the
    /// transport's `message_bytes_max`).
    pub snapshot_chunk_bytes: usize,
    /// The state machine refers to log entries at or below its snapshot
    /// (quire keeps entry and message bytes in the log): a snapshot sent
    /// to a follower is an *image* carrying those entries too
    /// ([`image`]), streamed by the caller chunk by chunk: the leader's
    /// reads each chunk when asked ([`Ready::image_reads`],
    /// [`Raft::send_image_chunk`]), the follower's stages each one
    /// durably ([`Ready::image_chunk`], [`Raft::image_stored`]). Every
    /// member must agree on it.
    pub snapshot_with_entries: bool,
    /// When the failure detector declares the leader down, campaign after
    /// a delay staggered by rank in slots of this length instead of an
    /// election timeout; a few network round trips (pre-vote and vote).
    pub fast_campaign_jitter_ms: u64,
    /// Leaders spread over nodes: the group prefers the voter at this
    /// rank (modulo the voters, in id order) as its leader, so group `d`
    /// given `Some(d)` prefers node `d % N` counted from the lowest id. The
    /// preferred voter campaigns first when the group starts, and a leader
    /// that is not it hands leadership back once it has been healthy for
    /// `preferred_leader_hold_ms`. `None`: whoever wins leads.
    pub preferred_leader_rank: Option<u64>,
    /// How long the preferred voter must have answered (within every
    /// election timeout) before a leader hands over to it: the hysteresis
    /// that keeps a preferred node that comes and goes from pulling
    /// leadership back and forth. Doubled after each handover that does
    /// not complete, for as long as this node leads, and for each other
    /// time this node became leader within 64 holds.
    pub preferred_leader_hold_ms: u64,
    /// Fault injection for checker validation only.
    pub planted_bug: Option<PlantedBug>,
}

impl RaftConfig {
    /// Defaults suited to a LAN: 150 ms election timeout, 30 ms heartbeats.
    pub fn new(id: NodeId, initial_voters: Vec<NodeId>) -> Self {
        RaftConfig {
            id,
            initial_voters,
            election_timeout_ms: 150,
            heartbeat_interval_ms: 30,
            pre_vote: true,
            check_quorum: true,
            inflight_msgs_max: 64,
            inflight_bytes_max: 8 << 20,
            append_bytes_max: 1 << 20,
            apply_bytes_max: 4 << 20,
            snapshot_entries: 100_000,
            snapshot_bytes: 64 << 20,
            snapshot_chunk_bytes: 1 << 20,
            snapshot_with_entries: false,
            fast_campaign_jitter_ms: 30,
            preferred_leader_rank: None,
            preferred_leader_hold_ms: 2_000,
            planted_bug: None,
        }
    }

    /// Checks what the core cannot run with; [`Raft::new`] and
    /// [`Raft::restore`] refuse a config this refuses.
    pub fn validate(&self) -> Result<(), RaftConfigError> {
        if self.id == 0 {
            return Err(RaftConfigError::IdReserved);
        }
        if self.heartbeat_interval_ms == 0 {
            return Err(RaftConfigError::Zero("heartbeat_interval_ms"));
        }
        if self.election_timeout_ms <= self.heartbeat_interval_ms {
            return Err(RaftConfigError::ElectionTimeoutTooShort {
                election_timeout_ms: self.election_timeout_ms,
                heartbeat_interval_ms: self.heartbeat_interval_ms,
            });
        }
        for (field, value) in [
            ("inflight_msgs_max", self.inflight_msgs_max as u64),
            ("inflight_bytes_max", self.inflight_bytes_max as u64),
            ("snapshot_entries", self.snapshot_entries),
            ("snapshot_bytes", self.snapshot_bytes),
            ("snapshot_chunk_bytes", self.snapshot_chunk_bytes as u64),
            ("preferred_leader_hold_ms", self.preferred_leader_hold_ms),
        ] {
            if value == 0 {
                return Err(RaftConfigError::Zero(field));
            }
        }
        Ok(())
    }
}

/// A [`RaftConfig`] the core cannot run with. [`RaftConfigError::field`]
/// names the field at fault, so a config file can name its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RaftConfigError {
    /// `id` is 0, which no node has (0 stands for "none" in messages).
    IdReserved,
    /// `election_timeout_ms` does not exceed `heartbeat_interval_ms`:
    /// followers would campaign between a leader's heartbeats.
    ElectionTimeoutTooShort {
        /// The election timeout given.
        election_timeout_ms: u64,
        /// The heartbeat interval given.
        heartbeat_interval_ms: u64,
    },
    /// A field that must be at least 1 is 0 (a timer that never fires, a
    /// window that never admits anything).
    Zero(&'static str),
}

impl RaftConfigError {
    /// The field of [`RaftConfig`] at fault.
    pub fn field(&self) -> &'static str {
        match self {
            RaftConfigError::IdReserved => "id",
            RaftConfigError::ElectionTimeoutTooShort { .. } => "election_timeout_ms",
            RaftConfigError::Zero(field) => field,
        }
    }
}

impl RaftConfigError {
    /// What is wrong with [`field`](Self::field), without its name.
    pub fn reason(&self) -> String {
        match self {
            RaftConfigError::IdReserved => "node id 0 is reserved".into(),
            RaftConfigError::ElectionTimeoutTooShort {
                election_timeout_ms,
                heartbeat_interval_ms,
            } => format!(
                "{election_timeout_ms} must exceed heartbeat_interval_ms ({heartbeat_interval_ms}): followers would campaign between heartbeats"
            ),
            RaftConfigError::Zero(_) => "must be at least 1".into(),
        }
    }
}

impl std::fmt::Display for RaftConfigError {
    /// The field, then what is wrong with it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field(), self.reason())
    }
}

impl std::error::Error for RaftConfigError {}

/// Durable state read back from storage when a replica restarts.
#[derive(Clone, Debug, Default)]
pub struct RestoredState {
    /// The last hard state written.
    pub hard_state: HardState,
    /// The latest snapshot, if any.
    pub snapshot: Option<Snapshot>,
    /// The entries after the snapshot, consecutive.
    pub entries: Vec<Entry>,
    /// Recovery found acknowledged entries damaged: the log held entries up
    /// to this index, and the node must not vote or lead until it is
    /// durable up to here again (re-fetched from the leader).
    pub repair_until: Option<Index>,
}

/// Everything the caller must do after feeding inputs: the output half of
/// the sans-IO interface. See the module doc for the order.
#[derive(Debug, Default)]
pub struct Ready {
    /// Hard state to persist, if it changed.
    pub hard_state: Option<HardState>,
    /// A snapshot from the leader to persist in place of the whole log and
    /// to restore into the state machine before applying anything else
    /// (with `snapshot_with_entries`: the one whose image the caller
    /// staged, whose staged entries become the log).
    pub snapshot: Option<Snapshot>,
    /// Leader, with `snapshot_with_entries`: chunks of snapshot images to
    /// read and hand back with [`Raft::send_image_chunk`].
    pub image_reads: Vec<ImageRead>,
    /// Follower, with `snapshot_with_entries`: a chunk of an image to
    /// stage durably, then report with [`Raft::image_stored`] (or
    /// [`Raft::image_refused`]). One at a time.
    pub image_chunk: Option<ImageChunk>,
    /// Storage must drop every entry at or after this index before
    /// appending `entries` (a conflicting suffix, thesis §3.5). The core
    /// owns this rule: the driver only carries it out.
    pub truncate_from: Option<Index>,
    /// Entries to append, consecutive.
    pub entries: Vec<Entry>,
    /// Messages to send now.
    pub messages: Vec<Message>,
    /// Messages to send only once everything written for this and earlier
    /// `Ready`s is durable (votes, follower acknowledgements).
    pub messages_after_persist: Vec<Message>,
    /// Committed entries to apply, in order.
    pub committed: Vec<Entry>,
    /// Linearizable reads that may be served once applied reaches them.
    pub read_states: Vec<ReadState>,
    /// The log has grown past `snapshot_entries` since the last snapshot:
    /// the caller should snapshot its state machine at the applied index and
    /// call [`Raft::compact`]. Raised once per `snapshot_entries` applied.
    pub snapshot_wanted: bool,
}

impl Ready {
    /// True if there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.hard_state.is_none()
            && self.snapshot.is_none()
            && self.truncate_from.is_none()
            && self.entries.is_empty()
            && self.messages.is_empty()
            && self.messages_after_persist.is_empty()
            && self.committed.is_empty()
            && self.read_states.is_empty()
            && !self.snapshot_wanted
            && self.image_reads.is_empty()
            && self.image_chunk.is_none()
    }
}

/// Why a proposal or request was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RaftError {
    /// This node is not the leader; the leader it knows of, if any.
    NotLeader {
        /// Current leader, if known.
        leader: Option<NodeId>,
    },
    /// A leadership transfer is under way; retry on the new leader.
    TransferInProgress,
    /// A membership change is still uncommitted (one at a time, §4.1).
    MembershipChangePending,
    /// The membership change (or transfer target) is invalid.
    InvalidMembershipChange(MembershipError),
    /// A compaction or snapshot request names an index that is not usable.
    InvalidIndex(String),
}

impl std::fmt::Display for RaftError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RaftError::NotLeader { leader: Some(l) } => write!(f, "not the leader; node {l} is"),
            RaftError::NotLeader { leader: None } => write!(f, "not the leader; no leader known"),
            RaftError::TransferInProgress => write!(f, "leadership transfer in progress"),
            RaftError::MembershipChangePending => {
                write!(f, "a membership change is still uncommitted")
            }
            RaftError::InvalidMembershipChange(why) => {
                write!(f, "invalid membership change: {why}")
            }
            RaftError::InvalidIndex(why) => write!(f, "invalid index: {why}"),
        }
    }
}

impl std::error::Error for RaftError {}

/// Counters of what this replica did, for metrics and the simulator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaftStats {
    /// Elections started (pre-vote rounds that went on to a real vote).
    pub elections_started: u64,
    /// Times this replica became leader.
    pub leaderships_won: u64,
    /// Times a leader stepped down because a majority fell silent.
    pub check_quorum_step_downs: u64,
    /// Snapshots sent to followers.
    pub snapshots_sent: u64,
    /// Snapshots installed from a leader.
    pub snapshots_installed: u64,
    /// Received snapshots refused because their entries did not decode.
    pub snapshots_refused: u64,
    /// Fast campaigns scheduled because the detector declared the leader down.
    pub fast_campaigns: u64,
    /// Times the serial heartbeat vouched for a leader not heard over IP.
    pub out_of_band_leader_contacts: u64,
    /// Times a leader stepped down for a higher term learnt out of band.
    pub out_of_band_step_downs: u64,
    /// Times a leader stepped down because its own disk stalled.
    pub disk_stall_step_downs: u64,
    /// Times a leader gave up leading because entries its state refers
    /// to went missing here ([`Raft::set_may_lead`]).
    pub repair_step_downs: u64,
    /// Handovers a leader started to the group's preferred voter.
    pub preferred_leader_transfers: u64,
    /// Of those, handovers that timed out before the preferred voter led.
    pub preferred_leader_transfers_failed: u64,
}

/// One replica of one Raft group. See the module documentation.
pub struct Raft {
    cfg: RaftConfig,
    id: NodeId,
    rng: ChaCha8Rng,
    now_ms: u64,

    role: Role,
    term: Term,
    vote: Option<NodeId>,
    leader: Option<NodeId>,
    log: RaftLog,
    /// Membership from the snapshot and from every membership entry after
    /// it, by index; the last one is in force (thesis §4.1: a server uses
    /// the latest configuration in its log, committed or not).
    memberships: BTreeMap<Index, Membership>,
    /// Latest snapshot (metadata and data) to send to lagging followers.
    snapshot: Option<Snapshot>,
    /// A transfer (the snapshot, and what InstallSnapshot carries for it)
    /// that a newer snapshot replaced while followers were receiving it:
    /// they get it whole rather than start over with each new snapshot,
    /// which would never end where a transfer takes longer than the
    /// snapshot interval. At most one; dropped once nobody receives it.
    previous_transfer: Option<(Snapshot, Vec<u8>)>,
    /// The snapshot index each follower last got a chunk of.
    snapshot_receivers: BTreeMap<NodeId, Index>,
    /// Image chunks to read (`Ready::image_reads`).
    image_reads: Vec<ImageRead>,
    /// The length of the image being sent to each follower.
    image_totals: BTreeMap<NodeId, u64>,
    /// See [`RestoredState::repair_until`]; 0 when the log is whole.
    repair_until: Index,
    /// False while the caller says this node must not lead
    /// ([`Raft::set_may_lead`]); it still votes.
    may_lead: bool,

    // follower and candidate
    election_deadline_ms: u64,
    /// When this node last heard from a current leader: the leader lease of
    /// §4.2.3 that makes it deaf to disruptive candidates.
    leader_contact_ms: Option<u64>,
    votes: BTreeMap<NodeId, bool>,

    // leader
    progress: BTreeMap<NodeId, Progress>,
    heartbeat_deadline_ms: u64,
    quorum_check_deadline_ms: u64,
    /// Index of the latest membership entry; proposals of another change
    /// wait until it is committed.
    pending_membership_index: Index,
    transfer: Option<transfer::Transfer>,
    /// Leader: since when the preferred voter has answered without a gap.
    preferred_answering_since_ms: Option<u64>,
    /// Leader: the hold in force, `preferred_leader_hold_ms` doubled per
    /// other time this node became leader lately and per handover that
    /// timed out during this leadership.
    preferred_hold_ms: u64,
    /// When this node became leader, the last few times within the
    /// longest hold: a node that keeps getting leadership back (the
    /// preferred voter takes it, then fails again) waits longer each time.
    leaderships_won_ms: VecDeque<u64>,
    reads: ReadIndexQueue,

    // output
    messages: Vec<Message>,
    messages_after_persist: Vec<Message>,
    pending_snapshot_install: Option<Snapshot>,
    /// Follower: the snapshot being received, chunk by chunk.
    snapshot_receiving: Option<Snapshot>,
    /// Follower, with `snapshot_with_entries`: the image being staged.
    image_receiving: Option<snapshot::ImageReceiving>,
    /// A chunk for the caller to stage (`Ready::image_chunk`).
    image_chunk: Option<ImageChunk>,
    persisted_hard_state: HardState,
    read_states: Vec<ReadState>,
    /// A leader has new entries or acks to turn into appends at `ready()`.
    replication_dirty: bool,
    /// Applied index at the last `snapshot_wanted`.
    snapshot_requested_at: Index,
    /// Bytes of entries handed out for applying since then.
    committed_bytes_since_request: u64,
    stats: RaftStats,
}

impl Raft {
    /// A fresh replica with an empty log. `seed` drives every random choice
    /// (election timeouts); `now_ms` starts the timers. A `cfg` that
    /// [`RaftConfig::validate`] refuses is refused here.
    pub fn new(cfg: RaftConfig, seed: u64, now_ms: u64) -> Result<Self, RaftConfigError> {
        let membership = Membership::with_voters(cfg.initial_voters.iter().copied());
        Self::build(cfg, seed, now_ms, RestoredState::default(), membership)
    }

    /// A replica recovered from its durable state after a restart; refused
    /// as [`Raft::new`] is.
    pub fn restore(
        cfg: RaftConfig,
        seed: u64,
        now_ms: u64,
        state: RestoredState,
    ) -> Result<Self, RaftConfigError> {
        let membership = match &state.snapshot {
            Some(s) => s.membership.clone(),
            None => Membership::with_voters(cfg.initial_voters.iter().copied()),
        };
        Self::build(cfg, seed, now_ms, state, membership)
    }

    fn build(
        cfg: RaftConfig,
        seed: u64,
        now_ms: u64,
        state: RestoredState,
        base_membership: Membership,
    ) -> Result<Self, RaftConfigError> {
        cfg.validate()?;
        let (snap_index, snap_term) = state
            .snapshot
            .as_ref()
            .map_or((0, 0), |s| (s.index, s.term));
        let mut memberships = BTreeMap::new();
        memberships.insert(snap_index, base_membership);
        for e in &state.entries {
            if let Payload::Membership(m) = &e.payload {
                memberships.insert(e.index, m.clone());
            }
        }
        let repair_until = state.repair_until.unwrap_or(0);
        let log = RaftLog::restored(
            snap_index,
            snap_term,
            state.entries,
            state.hard_state.commit,
        );
        let hs = state.hard_state;
        let mut raft = Raft {
            id: cfg.id,
            rng: ChaCha8Rng::seed_from_u64(seed),
            now_ms,
            role: Role::Follower,
            term: hs.term,
            vote: hs.vote,
            leader: None,
            log,
            memberships,
            snapshot: state.snapshot,
            previous_transfer: None,
            snapshot_receivers: BTreeMap::new(),
            image_reads: Vec::new(),
            image_totals: BTreeMap::new(),
            repair_until,
            may_lead: true,
            election_deadline_ms: 0,
            leader_contact_ms: None,
            votes: BTreeMap::new(),
            progress: BTreeMap::new(),
            heartbeat_deadline_ms: 0,
            quorum_check_deadline_ms: 0,
            pending_membership_index: 0,
            transfer: None,
            preferred_answering_since_ms: None,
            preferred_hold_ms: cfg.preferred_leader_hold_ms,
            leaderships_won_ms: VecDeque::new(),
            reads: ReadIndexQueue::default(),
            messages: Vec::new(),
            messages_after_persist: Vec::new(),
            pending_snapshot_install: None,
            snapshot_receiving: None,
            image_receiving: None,
            image_chunk: None,
            persisted_hard_state: hs,
            read_states: Vec::new(),
            replication_dirty: false,
            snapshot_requested_at: 0,
            committed_bytes_since_request: 0,
            stats: RaftStats::default(),
            cfg,
        };
        raft.reset_election_deadline();
        if raft.preferred_leader().is_some_and(|p| p != raft.id) {
            // The preferred voter campaigns first when the group starts, so
            // a healthy cluster begins with its leaders spread, not with
            // handovers; without it, the rest campaign one timeout later.
            raft.election_deadline_ms += raft.cfg.election_timeout_ms;
        }
        Ok(raft)
    }

    // ----- inspection -------------------------------------------------

    /// This replica's node id.
    pub fn id(&self) -> NodeId {
        self.id
    }
    /// Current role.
    pub fn role(&self) -> Role {
        self.role
    }
    /// Current term.
    pub fn term(&self) -> Term {
        self.term
    }
    /// The leader this replica follows (itself when leading), if known.
    pub fn leader(&self) -> Option<NodeId> {
        self.leader
    }
    /// Current vote.
    pub fn vote(&self) -> Option<NodeId> {
        self.vote
    }
    /// Commit index.
    pub fn commit_index(&self) -> Index {
        self.log.commit
    }
    /// Highest index storage reported durable.
    pub fn persisted_index(&self) -> Index {
        self.log.persisted
    }
    /// Highest index reported applied.
    pub fn applied_index(&self) -> Index {
        self.log.applied
    }
    /// Index of the last log entry.
    pub fn last_index(&self) -> Index {
        self.log.last_index()
    }
    /// Term of the last log entry.
    pub fn last_term(&self) -> Term {
        self.log.last_term()
    }
    /// First index still held in memory (after the snapshot).
    pub fn first_index(&self) -> Index {
        self.log.first_index()
    }
    /// Term of the entry at `index`, if held (or the snapshot's).
    pub fn term_at(&self, index: Index) -> Option<Term> {
        self.log.term(index)
    }
    /// The entry at `index`, if held in memory.
    pub fn entry(&self, index: Index) -> Option<&Entry> {
        self.log.entry(index)
    }
    /// Entries held in memory from `from` on.
    pub fn entries_from(&self, from: Index) -> impl Iterator<Item = &Entry> {
        self.log.iter_from(from)
    }
    /// Number of entries held in memory.
    pub fn log_len(&self) -> usize {
        self.log.len()
    }
    /// The latest snapshot, if any.
    pub fn snapshot(&self) -> Option<&Snapshot> {
        self.snapshot.as_ref()
    }
    /// The membership in force (the latest in the log).
    pub fn membership(&self) -> &Membership {
        self.memberships
            .values()
            .next_back()
            .expect("a membership is always known")
    }
    /// The leader's view of a follower, when leading.
    pub fn progress(&self, id: NodeId) -> Option<&Progress> {
        self.progress.get(&id)
    }
    /// Counters.
    pub fn stats(&self) -> RaftStats {
        self.stats
    }
    /// The hard state as it is now (not necessarily persisted yet).
    pub fn hard_state(&self) -> HardState {
        HardState {
            term: self.term,
            vote: self.vote,
            commit: self.log.commit,
        }
    }

    /// The next time `tick` must be called, in ms.
    #[must_use]
    pub fn poll_timeout(&self) -> u64 {
        match self.role {
            Role::Leader => {
                let mut t = self
                    .heartbeat_deadline_ms
                    .min(self.quorum_check_deadline_ms);
                if let Some(tr) = &self.transfer {
                    t = t.min(tr.deadline_ms);
                }
                t
            }
            _ => self.election_deadline_ms,
        }
    }

    // ----- inputs ------------------------------------------------------

    /// Advances time. Call at `poll_timeout()` or later; calling it earlier
    /// is harmless.
    pub fn tick(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
        match self.role {
            Role::Leader => self.tick_leader(),
            _ => {
                if self.now_ms >= self.election_deadline_ms {
                    self.election_timeout_fired();
                }
            }
        }
    }

    /// Handles one message from a peer of this group.
    pub fn step(&mut self, now_ms: u64, msg: Message) {
        self.now_ms = self.now_ms.max(now_ms);
        if msg.to != self.id || msg.from == self.id || msg.from == 0 {
            return; // misrouted: the transport should have dropped it
        }
        if msg.body.is_for_the_replica() {
            return; // its term says nothing of elections: not even looked at
        }
        if !self.step_term(&msg) {
            return;
        }
        match msg.body {
            Body::PreVote { .. } | Body::Vote { .. } => self.handle_vote_request(msg),
            Body::PreVoteResponse { granted } | Body::VoteResponse { granted } => {
                self.handle_vote_response(msg.from, msg.term, &msg.body, granted)
            }
            Body::Append {
                prev_index,
                prev_term,
                entries,
                commit,
            } => self.handle_append(msg.from, prev_index, prev_term, entries, commit),
            Body::AppendResponse(result) => self.handle_append_response(msg.from, result),
            Body::Heartbeat { commit, read_round } => {
                self.handle_heartbeat(msg.from, commit, read_round)
            }
            Body::HeartbeatResponse { read_round } => {
                self.handle_heartbeat_response(msg.from, read_round)
            }
            Body::InstallSnapshot {
                snapshot,
                offset,
                total,
            } => self.handle_install_snapshot(msg.from, snapshot, offset, total),
            Body::SnapshotAck { index, received } => {
                self.handle_snapshot_ack(msg.from, index, received)
            }
            Body::TimeoutNow => self.handle_timeout_now(msg.from),
            // Returned above: the replica's, not Raft's.
            Body::RepairRequest { .. } | Body::RepairEntries { .. } => {}
        }
    }

    /// Proposes application data. On the leader, returns the index and term
    /// the entry got; it is confirmed once `committed` hands it out.
    pub fn propose(&mut self, data: Vec<u8>) -> Result<(Index, Term), RaftError> {
        self.check_can_propose()?;
        Ok(self.append_as_leader(Payload::Normal(data.into())))
    }

    /// Storage reports that everything up to `index` (whose entry has
    /// `term`) is durable. Stale reports about replaced entries are ignored.
    pub fn persisted(&mut self, index: Index, term: Term) {
        if self.log.persisted_to(index, term) && self.role == Role::Leader {
            self.maybe_commit();
        }
    }

    /// The caller has applied every committed entry up to `index`.
    pub fn applied(&mut self, index: Index) {
        assert!(
            index <= self.log.applying,
            "applied {index} beyond what was handed out ({})",
            self.log.applying
        );
        self.log.applied = self.log.applied.max(index);
    }

    /// Failure-detector input: start an election now (the leader is known
    /// dead). Ignored on a leader or a node that may not vote.
    pub fn campaign(&mut self) {
        if self.role != Role::Leader && self.promotable() {
            self.leader_contact_ms = None;
            self.start_election(false);
        }
    }

    /// Failure-detector input: stop leading now, and stop serving reads
    /// (this node's own disk stalled).
    pub fn step_down(&mut self) {
        if self.role == Role::Leader {
            self.stats.disk_stall_step_downs += 1;
            self.become_follower(self.term, None);
        }
    }

    /// Whether this node may lead (the default). The caller says `false`
    /// while it cannot serve what a leader must: entries its state refers
    /// to are missing from its log, being repaired from a peer. Such a
    /// node neither campaigns nor takes a handover, but still votes: its
    /// log above the snapshot (what a vote vouches for) is intact, or
    /// [`is_repairing`](Self::is_repairing) says otherwise. A leader told
    /// `false` hands over to the voter that has most of its log, or, with
    /// none, steps down; a candidate gives its campaign up.
    pub fn set_may_lead(&mut self, may_lead: bool) {
        if self.may_lead == may_lead {
            return;
        }
        self.may_lead = may_lead;
        if may_lead || self.role == Role::Follower {
            return;
        }
        if self.role != Role::Leader {
            // A campaign under way would otherwise end in leading: give
            // it up (its vote for itself stands, as any candidate's does).
            self.become_follower(self.term, None);
            return;
        }
        self.stats.repair_step_downs += 1;
        let me = self.id;
        let best = self
            .membership()
            .voters
            .iter()
            .filter(|&&v| v != me)
            // The lowest id of the most caught up: the same choice on
            // every run.
            .max_by_key(|&&v| {
                let matched = self.progress(v).map_or(0, |p| p.match_index);
                (matched, std::cmp::Reverse(v))
            })
            .copied();
        if best.is_none_or(|t| self.transfer_leadership(t).is_err()) {
            self.become_follower(self.term, None);
        }
    }

    /// Whether this node may lead ([`set_may_lead`](Self::set_may_lead)).
    pub fn may_lead(&self) -> bool {
        self.may_lead
    }

    /// Collects everything the caller must do now. See [`Ready`].
    #[must_use = "the Ready holds writes, messages and committed entries; dropped, they are lost"]
    pub fn ready(&mut self) -> Ready {
        if self.role == Role::Leader && self.replication_dirty {
            self.broadcast_append();
        }
        let snapshot = self.pending_snapshot_install.take();
        let (truncate_from, entries) = self.log.take_unstable();
        let hs = self.hard_state();
        let mut persisted_hs = hs;
        if self.cfg.planted_bug == Some(PlantedBug::ForgetVote) {
            persisted_hs.vote = None;
        }
        let hard_state = (persisted_hs != self.persisted_hard_state).then(|| {
            self.persisted_hard_state = persisted_hs;
            persisted_hs
        });
        let committed = self.log.take_committed(self.cfg.apply_bytes_max);
        // Asked once per `snapshot_entries` applied, not in every Ready: a
        // caller that declines (or is still busy snapshotting) must still
        // see an empty Ready when nothing else happened.
        let th = self.cfg.snapshot_entries;
        self.committed_bytes_since_request +=
            committed.iter().map(|e| e.size_bytes() as u64).sum::<u64>();
        let by_entries = self.log.applied >= self.log.snapshot_index + th
            && self.log.applied >= self.snapshot_requested_at + th;
        let by_bytes = self.committed_bytes_since_request >= self.cfg.snapshot_bytes
            && self.log.applied > self.log.snapshot_index
            && self.log.applied > self.snapshot_requested_at;
        let snapshot_wanted = by_entries || by_bytes;
        if snapshot_wanted {
            self.snapshot_requested_at = self.log.applied;
            self.committed_bytes_since_request = 0;
        }
        Ready {
            hard_state,
            snapshot,
            image_reads: std::mem::take(&mut self.image_reads),
            image_chunk: self.image_chunk.take(),
            truncate_from,
            entries,
            messages: std::mem::take(&mut self.messages),
            messages_after_persist: std::mem::take(&mut self.messages_after_persist),
            committed,
            read_states: std::mem::take(&mut self.read_states),
            snapshot_wanted,
        }
    }

    // ----- shared helpers ----------------------------------------------

    /// True if this node may campaign: a voter of the membership in force.
    fn promotable(&self) -> bool {
        self.membership().voters.contains(&self.id) && !self.is_repairing() && self.may_lead
    }

    /// True while the log is being repaired after recovery found damaged
    /// entries: the node neither votes nor campaigns (a vote from a log
    /// missing acknowledged entries could elect a leader without them).
    pub fn is_repairing(&self) -> bool {
        self.cfg.planted_bug != Some(PlantedBug::VoteWhileRepairing)
            && self.log.persisted < self.repair_until
    }

    fn reset_election_deadline(&mut self) {
        let t = self.cfg.election_timeout_ms;
        self.election_deadline_ms = self.now_ms + self.rng.gen_range(t..2 * t);
    }

    /// Queues a message. Leader traffic goes out at once; anything a
    /// follower or candidate says depends on its durable state (a vote, an
    /// acknowledgement) and waits for persistence.
    fn send(&mut self, to: NodeId, body: Body) {
        let term = match body {
            Body::PreVote { .. } => self.term + 1,
            _ => self.term,
        };
        let msg = Message {
            from: self.id,
            to,
            term,
            body,
        };
        let leader_traffic = matches!(
            msg.body,
            Body::Append { .. }
                | Body::Heartbeat { .. }
                | Body::InstallSnapshot { .. }
                | Body::TimeoutNow
        );
        let early_ack = self.cfg.planted_bug == Some(PlantedBug::AckBeforeFsync)
            && matches!(msg.body, Body::AppendResponse(_));
        if leader_traffic || early_ack {
            self.messages.push(msg);
        } else {
            self.messages_after_persist.push(msg);
        }
    }

    /// Peers of the membership in force other than this node.
    fn peers(&self) -> Vec<NodeId> {
        self.membership()
            .members()
            .filter(|&p| p != self.id)
            .collect()
    }

    fn voters(&self) -> BTreeSet<NodeId> {
        self.membership().voters.clone()
    }

    fn become_follower(&mut self, term: Term, leader: Option<NodeId>) {
        if term > self.term {
            self.term = term;
            self.vote = None;
        }
        self.role = Role::Follower;
        self.leader = leader;
        self.progress.clear();
        self.transfer = None;
        self.reads.clear();
        self.votes.clear();
        self.replication_dirty = false;
        self.reset_election_deadline();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a one-node group's Ready loop, persisting and applying all.
    fn settle(r: &mut Raft) -> bool {
        let mut wanted = false;
        loop {
            let rd = r.ready();
            if rd.is_empty() {
                return wanted;
            }
            wanted |= rd.snapshot_wanted;
            if let Some(e) = rd.entries.last() {
                r.persisted(e.index, e.term);
            }
            if let Some(e) = rd.committed.last() {
                r.applied(e.index);
            }
        }
    }

    #[test]
    fn a_snapshot_is_asked_for_by_bytes_when_few_large_entries_pile_up() {
        let mut cfg = RaftConfig::new(1, vec![1]);
        cfg.snapshot_entries = 1_000_000;
        cfg.snapshot_bytes = 100 << 10;
        let mut r = Raft::new(cfg, 1, 0).unwrap();
        r.campaign();
        settle(&mut r);
        assert_eq!(r.role(), Role::Leader);
        let mut asked = Vec::new();
        for i in 0..10 {
            r.propose(vec![7; 30 << 10]).unwrap();
            if settle(&mut r) {
                asked.push(i);
            }
        }
        // 30 KiB (and the overhead) per entry: every fourth entry passes
        // 100 KiB since the last ask, and the count never would.
        assert_eq!(asked, vec![3, 7]);
    }

    #[test]
    fn repair_messages_are_the_replicas_and_never_move_raft() {
        let mut r = Raft::new(RaftConfig::new(1, vec![1, 2, 3]), 1, 0).unwrap();
        let (term, role) = (r.term(), r.role());
        for body in [
            Body::RepairRequest { indexes: vec![3] },
            Body::RepairEntries {
                entries: Vec::new(),
                not_held: vec![3],
            },
        ] {
            assert!(body.is_for_the_replica());
            r.step(
                5,
                Message {
                    from: 2,
                    to: 1,
                    term: term + 40,
                    body,
                },
            );
            assert_eq!(
                (r.term(), r.role()),
                (term, role),
                "a higher term moved nothing"
            );
            assert!(r.ready().is_empty(), "nothing to send or write");
        }
    }

    #[test]
    fn a_bad_config_is_refused_with_the_field_not_a_panic() {
        let ok = RaftConfig::new(1, vec![1, 2, 3]);
        assert_eq!(ok.validate(), Ok(()));
        type Spoil = fn(&mut RaftConfig);
        let cases: [(Spoil, RaftConfigError); 4] = [
            (|c| c.id = 0, RaftConfigError::IdReserved),
            (
                |c| c.heartbeat_interval_ms = 0,
                RaftConfigError::Zero("heartbeat_interval_ms"),
            ),
            (
                |c| c.election_timeout_ms = c.heartbeat_interval_ms,
                RaftConfigError::ElectionTimeoutTooShort {
                    election_timeout_ms: 30,
                    heartbeat_interval_ms: 30,
                },
            ),
            (
                |c| c.snapshot_chunk_bytes = 0,
                RaftConfigError::Zero("snapshot_chunk_bytes"),
            ),
        ];
        for (spoil, want) in cases {
            let mut cfg = ok.clone();
            spoil(&mut cfg);
            assert_eq!(cfg.validate(), Err(want.clone()));
            assert!(want.to_string().starts_with(want.field()), "{want}");
            let refused = Raft::new(cfg.clone(), 1, 0).err();
            assert_eq!(refused, Some(want.clone()));
            let refused = Raft::restore(cfg, 1, 0, RestoredState::default()).err();
            assert_eq!(refused, Some(want));
        }
    }
}
