//! What callers ask of a node's loops and how they are answered: the
//! command a handle (or a client server thread) sends to the loop owning a
//! group, the callbacks that carry each answer back, and why a request was
//! not served (`ProposeError`). Plain data, a leaf of `node`: it imports
//! nothing from the other files but the status view a `Status` command is
//! answered with.

use crate::consensus::{Index, NodeId, Term};
use crate::node::status::NodeStatus;
use crate::transport::GroupId;
use crossbeam_channel::Sender;

/// Why a proposal (or a read) was not confirmed. Each condition a caller
/// must tell apart has its own variant: whether retrying can help, here
/// or on another node, is in its doc and in the client code it maps to
/// (`client::dispatch::error_response`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProposeError {
    /// This node does not lead the group; the leader it knows, if any.
    NotLeader(Option<NodeId>),
    /// The entry was replaced by another leader's: it will never apply.
    Lost,
    /// This node stopped leading (a majority fell silent, a leadership
    /// transfer, a higher term, its own disk stalled) before the entry
    /// applied; the leader it knows, if any. The entry may still commit
    /// under the new leader: the outcome is unknown, and a retry with the
    /// same (client id, seq) is answered from the dedup table, so nothing
    /// applies twice.
    SteppedDown(Option<NodeId>),
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
            ProposeError::SteppedDown(l) => {
                write!(
                    f,
                    "not the leader any more: this node stopped leading before the request applied; outcome unknown, retry with the same sequence number"
                )?;
                match l {
                    Some(l) => write!(f, " (node {l} leads)"),
                    None => write!(f, " (no leader known yet)"),
                }
            }
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

/// Where a proposal's outcome goes: called once, on the loop's thread.
pub type Reply = Box<dyn FnOnce(Result<Index, ProposeError>) + Send>;

/// Where a read's entries go: called once, on the loop's thread.
pub type ReadReply = Box<dyn FnOnce(Result<Vec<(Index, Term, bytes::Bytes)>, ProposeError>) + Send>;

/// Where a state-machine command's outcome goes: called once, on the loop.
pub type StateReply = Box<dyn FnOnce(Result<crate::state::Outcome, ProposeError>) + Send>;

/// Where a query's answer goes: called once, on the loop's thread.
pub type QueryReply = Box<dyn FnOnce(Result<crate::state::Answer, ProposeError>) + Send>;

/// Where the outcome of an append from a client connection served on a
/// loop goes, instead of a callback: the loop (`core`) and connection
/// (slot `conn` in its `generation`) it came from, the request's id, and
/// the item's place in an `AppendBatch` (0 for a lone `Append`). Plain
/// data, copied; nothing is allocated per append to carry the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClientTicket {
    /// The loop serving the connection.
    pub(crate) core: usize,
    /// The connection's slot on that loop.
    pub(crate) conn: u32,
    /// Which connection in that slot (slots are reused).
    pub(crate) generation: u32,
    /// The request's id on the connection.
    pub(crate) request: u64,
    /// The item's position in its batch.
    pub(crate) item: u32,
}

/// A ticket's outcome: the index the append was applied at, or why not.
pub(crate) type TicketDone = (ClientTicket, Result<Index, ProposeError>);

/// A ticketed command's outcome once applied (its failures go with the
/// appends', as `TicketDone`s).
pub(crate) type CommandDone = (ClientTicket, crate::state::Outcome);

/// A command from the handle (or a server thread) to the loop of one core.
pub(crate) enum CoreCommand {
    /// Appends from a client connection served on another loop: items
    /// `first_seq..` of client `client_id`, answered by ticket (the
    /// ticket's `item` counts up from the given one).
    ClientAppends {
        group: GroupId,
        client_id: u64,
        first_seq: u64,
        items: Vec<Vec<u8>>,
        ticket: ClientTicket,
    },
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
    /// Hand the group's leadership to voter `to`; `reply` gets the term
    /// it leads once this node hears from it as leader.
    Transfer {
        group: GroupId,
        to: NodeId,
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
            // Answered by the loop that could not hand it over (it holds
            // the tickets); nothing to call here.
            CoreCommand::ClientAppends { .. } => {}
            CoreCommand::Propose { reply, .. }
            | CoreCommand::Append { reply, .. }
            | CoreCommand::Membership { reply, .. }
            | CoreCommand::Transfer { reply, .. } => reply(Err(why)),
            CoreCommand::Read { reply, .. } => reply(Err(why)),
            CoreCommand::State { reply, .. } => reply(Err(why)),
            CoreCommand::Query { reply, .. } => reply(Err(why)),
            CoreCommand::Status(_) | CoreCommand::Stop => {}
        }
    }
}

/// Wall-clock ms since the Unix epoch: the leader's clock stamped on
/// ledger and queue commands (creation times, visibility deadlines). The
/// loop's own clock restarts with the process; these must not.
pub(crate) fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
