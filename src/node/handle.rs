//! The handle a caller (the daemon, a test) holds on a running node loop:
//! commands go in over a channel, answers come back over one.

use super::config::NodeSpec;
use super::errors::StartError;
use super::event_loop::{CoreMailbox, CoreMsg, EventLoop, Wiring};
use super::log::log_warn;
use super::waker::Waker;
use crate::consensus::{Index, NodeId, Role, Term};
use crate::transport::GroupId;
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use std::collections::BTreeMap;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Why a proposal (or a read) was not confirmed. Each condition a caller
/// must tell apart has its own variant: whether retrying can help, here
/// or on another node, is in its doc and in the client code it maps to
/// (`client_server::error_response`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProposeError {
    /// This node does not lead the group; the leader it knows, if any.
    NotLeader(Option<NodeId>),
    /// The entry was replaced by another leader's: it will never apply.
    Lost,
    /// No space for the log: appends are refused until space returns.
    DiskFull,
    /// The group's log stopped on this node (a write or sync error, a
    /// snapshot from the leader that does not decode), with why: the
    /// group is out of service here until the node restarts; other nodes
    /// may serve it.
    LogStopped(String),
    /// No such group on this node. Every node runs the same groups, so
    /// none in the cluster: retrying will not help.
    UnknownGroup(GroupId),
    /// The node is stopping: its loops are gone or going.
    Stopping,
    /// Client `client_id`'s sequence number `seq` is older than the
    /// window of sequence numbers the group remembers per client
    /// (`state::dedup::WINDOW`): it may have been applied before, and
    /// its index is forgotten. Nothing was applied now, and a retry under
    /// the same seq is refused the same way: permanent.
    SeqForgotten {
        /// The client.
        client_id: u64,
        /// The sequence number refused.
        seq: u64,
    },
    /// A read starts below the first entry this node still holds as log
    /// entries (`first`); the earlier ones were compacted into a snapshot
    /// here. Another node, whose snapshot is older, may still hold them.
    Compacted {
        /// The first index this node can read.
        first: Index,
    },
    /// This node cannot read back a log entry it needs (a read error, or
    /// an entry the ledgers and queues refer to that is missing), with
    /// what and where. For a command the command may have applied: the
    /// outcome is unknown, and a retry under the same seq is safe.
    Unreadable(String),
    /// Something the node never expects (a bug), with what. As with
    /// `Unreadable`, an entry may have applied: the outcome is unknown.
    Internal(String),
    /// No answer within the caller's timeout: the outcome is unknown.
    Timeout,
    /// The state machine refused the command (its state is unchanged).
    Refused(crate::state::Error),
    /// The entry the request makes is larger than the group's
    /// `entry_bytes_max`; refused before it was proposed.
    TooLarge {
        /// Bytes of the entry the request would make.
        bytes: usize,
        /// The group's limit, in bytes.
        max: usize,
    },
    /// A retry (same client id and sequence number) whose bytes differ
    /// from what was applied under them: two clients share an id, or a
    /// client reused a sequence number. Nothing was applied.
    Conflict {
        /// The index the first request under that (client, seq) holds.
        applied_at: Index,
    },
    /// The request cannot succeed as asked, whatever the timing (a
    /// membership change that does not apply to the membership: removing
    /// a non-member, adding a member twice); retrying will not help.
    Invalid(String),
    /// Another operation must finish first (a membership change still
    /// uncommitted, a leadership transfer), or a bound on waiting work is
    /// reached (long polls): retry later.
    Busy(String),
    /// A promotion to voter of a learner that has not caught up with the
    /// leader's log (how far behind, and the bound): wait, or force it.
    Lagging(String),
}

impl std::fmt::Display for ProposeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProposeError::NotLeader(Some(l)) => write!(f, "not the leader; node {l} is"),
            ProposeError::NotLeader(None) => write!(f, "not the leader; no leader known"),
            ProposeError::Lost => write!(f, "replaced by another leader's entry"),
            ProposeError::DiskFull => write!(f, "disk full"),
            ProposeError::LogStopped(why) => {
                write!(f, "unavailable: the group's log stopped on this node: {why}")
            }
            ProposeError::UnknownGroup(g) => write!(f, "group {g} is not on this node"),
            ProposeError::Stopping => write!(f, "unavailable: node stopping"),
            ProposeError::SeqForgotten { client_id, seq } => write!(
                f,
                "client {client_id}: sequence number {seq} is older than the {} this group remembers per client; \
                 it may have been applied before under it, and its index is forgotten; nothing was applied",
                crate::state::dedup::WINDOW
            ),
            ProposeError::Compacted { first } => write!(
                f,
                "unavailable: entries below {first} were compacted into a snapshot on this node"
            ),
            ProposeError::Unreadable(why) => write!(f, "unavailable: {why}"),
            ProposeError::Internal(why) => write!(f, "internal error: {why}"),
            ProposeError::Timeout => write!(f, "no answer in time; outcome unknown"),
            ProposeError::Refused(e) => write!(f, "refused: {e}"),
            ProposeError::TooLarge { bytes, max } => write!(
                f,
                "too large: the request makes an entry of {bytes} bytes; this group's entry_bytes_max is {max} bytes"
            ),
            ProposeError::Conflict { applied_at } => write!(
                f,
                "conflict: this client id and sequence number were already used for other bytes (applied at index {applied_at}); nothing was applied"
            ),
            ProposeError::Invalid(why) => write!(f, "invalid: {why}"),
            ProposeError::Busy(why) => write!(f, "busy: {why}"),
            ProposeError::Lagging(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for ProposeError {}

/// One group as this node sees it.
#[derive(Clone, Debug)]
pub struct GroupView {
    /// The group.
    pub group: GroupId,
    /// This node's role in it.
    pub role: Role,
    /// Current term.
    pub term: Term,
    /// The leader it knows.
    pub leader: Option<NodeId>,
    /// Commit index.
    pub commit: Index,
    /// Applied index.
    pub applied: Index,
    /// Durable index.
    pub persisted: Index,
    /// Hash of the applied data (equal on every node at equal `applied`).
    pub applied_hash: u64,
    /// The voters of the membership in force here.
    pub voters: Vec<NodeId>,
    /// The learners (non-voting members catching up).
    pub learners: Vec<NodeId>,
    /// healthy, degraded, full or failed (with why).
    pub disk: String,
    /// The log's I/O backend: io_uring or portable.
    pub backend: &'static str,
    /// On the leader: each follower's replication lag in entries (the
    /// leader's last index minus the follower's durable match index).
    pub follower_lag: Vec<(NodeId, u64)>,
    /// The log's counters.
    pub wal: WalView,
    /// What its snapshots cost.
    pub snapshot: super::replica::SnapshotStats,
    /// Ledger reads waiting on this leader for an entry to be confirmed
    /// (long polls).
    pub waiting_reads: usize,
    /// The Raft counters.
    pub stats: crate::consensus::RaftStats,
}

/// A group log's counters (from `storage::WalMetrics`).
#[derive(Clone, Copy, Debug, Default)]
pub struct WalView {
    /// Flushes (write + fdatasync) completed.
    pub flushes: u64,
    /// Flush latency, µs: median and 99th percentile.
    pub flush_p50_us: u64,
    /// 99th percentile.
    pub flush_p99_us: u64,
    /// Records per flush, median.
    pub records_per_flush_p50: u64,
    /// Bytes written, padding included.
    pub bytes: u64,
    /// Trimmed segments kept for reuse.
    pub segments_recycled: u64,
    /// Segments zero-filled.
    pub segments_zero_filled: u64,
    /// Flushes slower than `disk_stall_ms`.
    pub stalls: u64,
    /// Write or sync errors.
    pub io_errors: u64,
    /// Appends refused for a full disk.
    pub disk_full_refusals: u64,
}

/// One link (peer × channel) as this node's detector sees it.
#[derive(Clone, Debug)]
pub struct LinkView {
    /// The peer.
    pub peer: NodeId,
    /// `udp` or `serial`.
    pub channel: &'static str,
    /// init, up, late or dead.
    pub state: &'static str,
    /// Ms since the peer was last heard on it, if ever.
    pub last_heard_ago_ms: Option<u64>,
}

/// A peer's classification.
#[derive(Clone, Debug)]
pub struct PeerView {
    /// The peer.
    pub peer: NodeId,
    /// unknown, up, ip-partitioned, serial-down or down.
    pub status: &'static str,
    /// Its disk looks stalled (a group with writes pending, no fsync).
    pub disk_stalled: bool,
}

/// A node's state, for `quire status` and tests.
#[derive(Clone, Debug)]
pub struct NodeStatus {
    /// The node.
    pub id: NodeId,
    /// Ms since the loop started.
    pub uptime_ms: u64,
    /// Its groups.
    pub groups: Vec<GroupView>,
    /// Every link.
    pub links: Vec<LinkView>,
    /// Every peer.
    pub peers: Vec<PeerView>,
    /// The alarm line: some link is dead.
    pub alarm: bool,
    /// Every detector transition so far, one line each, oldest first
    /// (bounded; the newest are kept).
    pub transitions: Vec<String>,
    /// Raft messages the transport refused for a full window (Raft resends).
    pub sends_refused: u64,
    /// Datagrams dropped for a bad MAC (forged, or another cluster's key).
    pub mac_failures: u64,
    /// Datagrams dropped as malformed.
    pub malformed_dropped: u64,
    /// The replication transport per peer.
    pub transport: Vec<TransportView>,
    /// The client server's connection counters (zero without one).
    pub clients: super::client_stats::ClientView,
    /// The node's own stalls (its loops paused or starved), which are not
    /// counted against its peers or timers.
    pub stalls: StallView,
}

/// A node's own stalls, summed over its loops.
#[derive(Clone, Copy, Debug, Default)]
pub struct StallView {
    /// Loop turns that came back later than asked by more than
    /// `stall_grace_ms`.
    pub count: u64,
    /// Ms not counted, summed over the loops.
    pub stalled_ms: u64,
    /// The longest single stall of any loop, in ms.
    pub longest_ms: u64,
}

impl StallView {
    fn merge(&mut self, other: StallView) {
        self.count += other.count;
        self.stalled_ms += other.stalled_ms;
        self.longest_ms = self.longest_ms.max(other.longest_ms);
    }
}

impl NodeStatus {
    /// What an operator must look at now, one line each: a dead link, a
    /// group without a leader, a disk that failed or is full. Empty when
    /// all is well; `quire status` prints each as an ALARM line.
    pub fn alarms(&self) -> Vec<String> {
        let mut alarms = Vec::new();
        if self.alarm {
            alarms.push("a link is down".to_string());
        }
        for g in &self.groups {
            if g.leader.is_none() {
                alarms.push(format!("group {} has no leader", g.group));
            }
            if g.disk.starts_with("failed") || g.disk == "full" {
                alarms.push(format!("group {} disk {}", g.group, g.disk));
            }
        }
        alarms
    }
}

/// The replication transport to one peer, summed over the node's cores.
#[derive(Clone, Copy, Debug, Default)]
pub struct TransportView {
    /// The peer.
    pub peer: NodeId,
    /// Datagrams sent to it.
    pub datagrams_sent: u64,
    /// Authenticated datagrams received from it.
    pub datagrams_received: u64,
    /// NACK rounds sent to it (gaps it left).
    pub nack_rounds: u64,
    /// DATA frames retransmitted to it (it asked for them), over every
    /// group's channel.
    pub retransmits: u64,
    /// Smoothed round-trip time, µs (0 before the first sample).
    pub rtt_us: u64,
}

impl NodeStatus {
    /// The view of `group`, if this node has it.
    pub fn group(&self, group: GroupId) -> Option<&GroupView> {
        self.groups.iter().find(|g| g.group == group)
    }

    /// The classification of `peer`.
    pub fn peer(&self, peer: NodeId) -> Option<&PeerView> {
        self.peers.iter().find(|p| p.peer == peer)
    }
}

/// Where a proposal's outcome goes: called once, on the loop's thread.
pub type Reply = Box<dyn FnOnce(Result<Index, ProposeError>) + Send>;

/// Where a read's entries go: called once, on the loop's thread.
pub type ReadReply = Box<dyn FnOnce(Result<Vec<(Index, Term, Vec<u8>)>, ProposeError>) + Send>;

/// Where a state-machine command's outcome goes: called once, on the loop.
pub type StateReply = Box<dyn FnOnce(Result<crate::state::Outcome, ProposeError>) + Send>;

/// Where a query's answer goes: called once, on the loop's thread.
pub type QueryReply = Box<dyn FnOnce(Result<crate::state::Answer, ProposeError>) + Send>;

/// A command from the handle (or a server thread) to the loop of one core.
pub(crate) enum CoreCommand {
    Propose {
        group: GroupId,
        data: Vec<u8>,
        reply: Reply,
    },
    Append {
        group: GroupId,
        client_id: u64,
        seq: u64,
        data: Vec<u8>,
        reply: Reply,
    },
    Membership {
        group: GroupId,
        change: crate::consensus::MembershipChange,
        /// Promote a learner that has not caught up, or a non-member.
        force: bool,
        reply: Reply,
    },
    Read {
        group: GroupId,
        from: Index,
        max_entries: usize,
        max_bytes: usize,
        /// Finding nothing from `from` on, wait this long for it (a tail).
        wait_ms: u32,
        /// Serve from this node's applied log, leader or not (may lag);
        /// false: a read-index round on the leader, `NotLeader` elsewhere.
        stale: bool,
        reply: ReadReply,
    },
    State {
        group: GroupId,
        client_id: u64,
        seq: u64,
        command: crate::state::Command,
        reply: StateReply,
    },
    Query {
        group: GroupId,
        query: crate::state::Query,
        /// A ledger read that finds nothing past the LAC waits this long.
        wait_ms: u32,
        reply: QueryReply,
    },
    Status(Sender<NodeStatus>),
    Stop,
}

impl CoreCommand {
    /// Answers the command's caller with `why` (it could not be served).
    pub(crate) fn fail(self, why: ProposeError) {
        match self {
            CoreCommand::Propose { reply, .. }
            | CoreCommand::Append { reply, .. }
            | CoreCommand::Membership { reply, .. } => reply(Err(why)),
            CoreCommand::Read { reply, .. } => reply(Err(why)),
            CoreCommand::State { reply, .. } => reply(Err(why)),
            CoreCommand::Query { reply, .. } => reply(Err(why)),
            CoreCommand::Status(_) | CoreCommand::Stop => {}
        }
    }
}

/// One core's loop.
struct CoreLoop {
    commands: Sender<CoreCommand>,
    waker: Waker,
    thread: Option<JoinHandle<()>>,
}

impl CoreLoop {
    /// Hands the loop a command and wakes it; gives the command back if
    /// the loop has stopped.
    fn send(&self, cmd: CoreCommand) -> Result<(), CoreCommand> {
        self.commands.send(cmd).map_err(|e| e.0)?;
        self.waker.wake();
        Ok(())
    }
}

/// A running node: one loop per core that owns groups.
pub struct NodeHandle {
    id: NodeId,
    cores: Vec<CoreLoop>,
    /// Which loop owns each group.
    owner: BTreeMap<GroupId, usize>,
    /// Counted by the client server, shown by the admin endpoint.
    clients: std::sync::Arc<super::client_stats::ClientCounters>,
}

impl NodeHandle {
    /// Runs the node's groups on one loop thread, not pinned.
    pub fn spawn(spec: NodeSpec) -> Result<NodeHandle, StartError> {
        Self::spawn_on(spec, &[])
    }

    /// Runs group `g` on core `cores[g % cores.len()]`, one loop thread
    /// per core that gets a group, each pinned to its core (an empty list:
    /// one loop, not pinned). The logs and sockets are opened on the loop
    /// threads themselves, which own them for good (an io_uring ring is
    /// never shared); errors name what could not be opened.
    pub fn spawn_on(spec: NodeSpec, cores: &[usize]) -> Result<NodeHandle, StartError> {
        spec.validate()?;
        let id = spec.id;
        let started = Instant::now();
        // Core -> its groups, in the order of the first group's core first.
        let mut plan: Vec<(Option<usize>, Vec<super::GroupSpec>)> = Vec::new();
        let mut groups = spec.groups.clone();
        groups.sort_by_key(|g| g.group);
        for g in groups {
            let core = (!cores.is_empty()).then(|| cores[g.group as usize % cores.len()]);
            match plan.iter_mut().find(|(c, _)| *c == core) {
                Some((_, gs)) => gs.push(g),
                None => plan.push((core, vec![g])),
            }
        }
        let mesh: Vec<(Sender<CoreMsg>, Receiver<CoreMsg>)> =
            plan.iter().map(|_| unbounded()).collect();
        let wakers = plan
            .iter()
            .map(|_| Waker::new())
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|error| StartError::Os {
                what: "creating a loop's eventfd",
                error,
            })?;
        let mailbox = |i: usize| CoreMailbox {
            tx: mesh[i].0.clone(),
            waker: wakers[i].clone(),
        };
        let mut handle = NodeHandle {
            id,
            cores: Vec::new(),
            owner: BTreeMap::new(),
            clients: std::sync::Arc::default(),
        };
        for (i, (core, groups)) in plan.into_iter().enumerate() {
            for g in &groups {
                handle.owner.insert(g.group, i);
            }
            let wiring = if i == 0 {
                Wiring::Control((1..mesh.len()).map(mailbox).collect())
            } else {
                Wiring::Worker(mailbox(0))
            };
            let waker = wakers[i].clone();
            let inbox = mesh[i].1.clone();
            let core_spec = NodeSpec {
                groups,
                ..spec.clone()
            };
            let (tx, rx) = unbounded();
            let (opened_tx, opened) = bounded(1);
            let name = match core {
                Some(c) => format!("quire-n{id}-core{c}"),
                None => format!("quire-n{id}"),
            };
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    if let Some(c) = core {
                        if !core_affinity::set_for_current(core_affinity::CoreId { id: c }) {
                            log_warn!(
                                "node {id}: could not pin a loop to core {c}; it runs unpinned"
                            );
                        }
                    }
                    match EventLoop::open(core_spec, started, rx, inbox, wiring, waker) {
                        Ok(mut ev) => {
                            let _ = opened_tx.send(Ok(()));
                            ev.run();
                        }
                        Err(e) => {
                            let _ = opened_tx.send(Err(e));
                        }
                    }
                })
                .map_err(|error| StartError::Os {
                    what: "starting a node thread",
                    error,
                })?;
            let opened = opened.recv().unwrap_or(Err(StartError::LoopDied));
            handle.cores.push(CoreLoop {
                commands: tx,
                waker: wakers[i].clone(),
                thread: Some(thread),
            });
            // On failure, dropping the handle stops the loops already started.
            opened?;
        }
        Ok(handle)
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Proposes `data` to `group` and waits up to `timeout` for it to be
    /// applied here.
    pub fn propose(
        &self,
        group: GroupId,
        data: Vec<u8>,
        timeout: Duration,
    ) -> Result<Index, ProposeError> {
        self.call(group, timeout, |reply| CoreCommand::Propose {
            group,
            data,
            reply,
        })
    }

    /// Appends `data` as client `client_id`'s append number `seq` and
    /// waits up to `timeout` for it to be applied here. A retry with the
    /// same id and seq is applied only once and answered with the index
    /// of the first.
    pub fn append(
        &self,
        group: GroupId,
        client_id: u64,
        seq: u64,
        data: Vec<u8>,
        timeout: Duration,
    ) -> Result<Index, ProposeError> {
        self.call(group, timeout, |reply| CoreCommand::Append {
            group,
            client_id,
            seq,
            data,
            reply,
        })
    }

    /// Sends the command `make` builds to the loop owning `group` and
    /// waits up to `timeout` for its answer.
    fn call<T: Send + 'static>(
        &self,
        group: GroupId,
        timeout: Duration,
        make: impl FnOnce(Box<dyn FnOnce(Result<T, ProposeError>) + Send>) -> CoreCommand,
    ) -> Result<T, ProposeError> {
        let (tx, answer) = bounded(1);
        let reply: Box<dyn FnOnce(Result<T, ProposeError>) + Send> = Box::new(move |r| {
            let _ = tx.send(r);
        });
        self.submit(group, make(reply))?;
        answer
            .recv_timeout(timeout)
            .unwrap_or(Err(ProposeError::Timeout))
    }

    /// Hands a command to the loop owning `group` without waiting; if it
    /// cannot be handed over, its caller is answered here at once.
    fn dispatch(&self, group: GroupId, cmd: CoreCommand) {
        match self.owner.get(&group) {
            Some(&core) => {
                if let Err(cmd) = self.cores[core].send(cmd) {
                    cmd.fail(ProposeError::Stopping);
                }
            }
            None => cmd.fail(ProposeError::UnknownGroup(group)),
        }
    }

    /// Hands a command to the loop owning `group` without waiting: its
    /// reply callback runs on that loop when the outcome is known.
    fn submit(&self, group: GroupId, cmd: CoreCommand) -> Result<(), ProposeError> {
        let Some(&core) = self.owner.get(&group) else {
            return Err(ProposeError::UnknownGroup(group));
        };
        self.cores[core]
            .send(cmd)
            .map_err(|_| ProposeError::Stopping)
    }

    /// `append` without waiting: `reply` is called on the group's loop
    /// once the outcome is known (for pipelining servers). If the command
    /// cannot even be handed over, `reply` is called here at once.
    pub fn append_with(
        &self,
        group: GroupId,
        client_id: u64,
        seq: u64,
        data: Vec<u8>,
        reply: Reply,
    ) {
        let cmd = CoreCommand::Append {
            group,
            client_id,
            seq,
            data,
            reply,
        };
        self.dispatch(group, cmd);
    }

    /// Proposes a ledger or queue command as client `client_id`'s request
    /// `seq` (0: no deduplication), without waiting: `reply` gets the
    /// outcome once it is applied here. A retry with the same id and seq
    /// is applied once and answered with the first outcome.
    pub fn state_with(
        &self,
        group: GroupId,
        client_id: u64,
        seq: u64,
        command: crate::state::Command,
        reply: StateReply,
    ) {
        let cmd = CoreCommand::State {
            group,
            client_id,
            seq,
            command,
            reply,
        };
        self.dispatch(group, cmd);
    }

    /// `state_with`, waiting up to `timeout` for the outcome.
    pub fn state(
        &self,
        group: GroupId,
        client_id: u64,
        seq: u64,
        command: crate::state::Command,
        timeout: Duration,
    ) -> Result<crate::state::Outcome, ProposeError> {
        self.call(group, timeout, |reply| CoreCommand::State {
            group,
            client_id,
            seq,
            command,
            reply,
        })
    }

    /// Answers a query on the leader, linearizably (a read index round),
    /// without waiting: `reply` gets the answer.
    pub fn query_with(&self, group: GroupId, query: crate::state::Query, reply: QueryReply) {
        self.query_waiting(group, query, 0, reply);
    }

    /// `query_with`, except that a `ReadLedger` finding nothing past the
    /// LAC waits up to `wait_ms` for an entry to be confirmed (a long
    /// poll, answered as soon as one is, or empty at the end).
    pub fn query_waiting(
        &self,
        group: GroupId,
        query: crate::state::Query,
        wait_ms: u32,
        reply: QueryReply,
    ) {
        self.dispatch(
            group,
            CoreCommand::Query {
                group,
                query,
                wait_ms,
                reply,
            },
        );
    }

    /// `query_with`, waiting up to `timeout` for the answer.
    pub fn query(
        &self,
        group: GroupId,
        query: crate::state::Query,
        timeout: Duration,
    ) -> Result<crate::state::Answer, ProposeError> {
        self.call(group, timeout, |reply| CoreCommand::Query {
            group,
            query,
            wait_ms: 0,
            reply,
        })
    }

    /// Changes `group`'s membership (one server at a time: add a learner,
    /// promote a learner to voter, remove a member) and waits up to
    /// `timeout` for the change to be applied here; only the leader takes
    /// it (`NotLeader` otherwise). A promotion is refused unless the node
    /// is a learner within `LEARNER_CAUGHT_UP_ENTRIES_MAX` entries of the
    /// leader's last index (`Lagging`, or `Invalid` for a non-learner);
    /// `change_membership_with(.., force: true, ..)` skips that check.
    pub fn change_membership(
        &self,
        group: GroupId,
        change: crate::consensus::MembershipChange,
        timeout: Duration,
    ) -> Result<Index, ProposeError> {
        self.change_membership_with(group, change, false, timeout)
    }

    /// `change_membership`, with `force`: promote a learner however far
    /// behind it is, or add a non-member directly as a voter.
    pub fn change_membership_with(
        &self,
        group: GroupId,
        change: crate::consensus::MembershipChange,
        force: bool,
        timeout: Duration,
    ) -> Result<Index, ProposeError> {
        self.call(group, timeout, |reply| CoreCommand::Membership {
            group,
            change,
            force,
            reply,
        })
    }

    /// Committed entries of `group` from `from` on (at most `max_entries`,
    /// about `max_bytes`), without waiting: `reply` gets them. Linearizable
    /// unless `stale`: the leader answers after a read-index round (every
    /// entry committed before the call is in the answer), a follower with
    /// `NotLeader`. A `stale` read is this node's applied log, leader or
    /// not: it may miss entries committed but not yet applied here.
    pub fn read_with(
        &self,
        group: GroupId,
        from: Index,
        max_entries: usize,
        max_bytes: usize,
        stale: bool,
        reply: ReadReply,
    ) {
        self.read_waiting(group, from, max_entries, max_bytes, 0, stale, reply);
    }

    /// `read_with`, except that finding nothing committed from `from` on,
    /// it waits up to `wait_ms` for an entry to be (a tail, answered as
    /// soon as one is applied here, or empty at the end).
    #[allow(clippy::too_many_arguments)] // the fields of one wire request
    pub fn read_waiting(
        &self,
        group: GroupId,
        from: Index,
        max_entries: usize,
        max_bytes: usize,
        wait_ms: u32,
        stale: bool,
        reply: ReadReply,
    ) {
        let cmd = CoreCommand::Read {
            group,
            from,
            max_entries,
            max_bytes,
            wait_ms,
            stale,
            reply,
        };
        self.dispatch(group, cmd);
    }

    /// Committed entries of `group` from `from` on, waiting up to `timeout`
    /// for the answer; linearizable (`read_with`, not stale).
    pub fn read(
        &self,
        group: GroupId,
        from: Index,
        max_entries: usize,
        timeout: Duration,
    ) -> Result<Vec<(Index, Term, Vec<u8>)>, ProposeError> {
        let (tx, answer) = bounded(1);
        self.read_with(
            group,
            from,
            max_entries,
            usize::MAX,
            false,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        answer
            .recv_timeout(timeout)
            .unwrap_or(Err(ProposeError::Timeout))
    }

    /// The groups this node runs.
    pub fn groups(&self) -> impl Iterator<Item = GroupId> + '_ {
        self.owner.keys().copied()
    }

    /// The node's state now, gathered from every loop; `None` if a loop
    /// has stopped.
    pub fn status(&self) -> Option<NodeStatus> {
        let mut merged: Option<NodeStatus> = None;
        for core in &self.cores {
            let (reply, answer) = bounded(1);
            core.send(CoreCommand::Status(reply)).ok()?;
            let s = answer.recv_timeout(Duration::from_secs(5)).ok()?;
            match merged.as_mut() {
                None => merged = Some(s),
                Some(m) => {
                    m.groups.extend(s.groups);
                    m.transitions.extend(s.transitions);
                    m.sends_refused += s.sends_refused;
                    m.mac_failures += s.mac_failures;
                    m.malformed_dropped += s.malformed_dropped;
                    m.stalls.merge(s.stalls);
                    for t in s.transport {
                        match m.transport.iter_mut().find(|x| x.peer == t.peer) {
                            Some(x) => {
                                x.datagrams_sent += t.datagrams_sent;
                                x.datagrams_received += t.datagrams_received;
                                x.nack_rounds += t.nack_rounds;
                                x.retransmits += t.retransmits;
                                if x.rtt_us == 0 {
                                    x.rtt_us = t.rtt_us;
                                }
                            }
                            None => m.transport.push(t),
                        }
                    }
                }
            }
        }
        if let Some(m) = merged.as_mut() {
            m.groups.sort_by_key(|g| g.group);
            m.clients = self.clients.view();
        }
        merged
    }

    /// The counters the client server keeps for this node.
    pub fn client_counters(&self) -> &std::sync::Arc<super::client_stats::ClientCounters> {
        &self.clients
    }

    /// Stops every loop: in-flight flushes finish, then they exit.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        for c in &self.cores {
            let _ = c.send(CoreCommand::Stop);
        }
        for c in &mut self.cores {
            if let Some(t) = c.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for NodeHandle {
    fn drop(&mut self) {
        self.stop_inner();
    }
}
