//! The handle a caller (the daemon, a test) holds on a running node loop:
//! commands go in over a channel, answers come back over one.

use super::config::NodeSpec;
use super::event_loop::EventLoop;
use crate::consensus::{Index, NodeId, Role, Term};
use crate::transport::GroupId;
use crossbeam_channel::{bounded, unbounded, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

/// Why a proposal was not confirmed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProposeError {
    /// This node does not lead the group; the leader it knows, if any.
    NotLeader(Option<NodeId>),
    /// The entry was replaced by another leader's: it will never apply.
    Lost,
    /// No space for the log: appends are refused until space returns.
    DiskFull,
    /// The group cannot serve here (log stopped, unknown group, node stopping).
    Unavailable(String),
    /// No answer within the caller's timeout: the outcome is unknown.
    Timeout,
}

impl std::fmt::Display for ProposeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProposeError::NotLeader(Some(l)) => write!(f, "not the leader; node {l} is"),
            ProposeError::NotLeader(None) => write!(f, "not the leader; no leader known"),
            ProposeError::Lost => write!(f, "replaced by another leader's entry"),
            ProposeError::DiskFull => write!(f, "disk full"),
            ProposeError::Unavailable(why) => write!(f, "unavailable: {why}"),
            ProposeError::Timeout => write!(f, "no answer in time; outcome unknown"),
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
    /// healthy, degraded, full or failed (with why).
    pub disk: String,
    /// The Raft counters.
    pub stats: crate::consensus::RaftStats,
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

/// A command to the loop.
pub(crate) enum Command {
    Propose {
        group: GroupId,
        data: Vec<u8>,
        reply: Sender<Result<Index, ProposeError>>,
    },
    Status(Sender<NodeStatus>),
    Stop,
}

/// A running node loop.
pub struct NodeHandle {
    id: NodeId,
    commands: Sender<Command>,
    thread: Option<JoinHandle<()>>,
}

impl NodeHandle {
    /// Opens the logs, binds the sockets and starts the loop thread.
    /// Errors name what could not be opened.
    pub fn spawn(spec: NodeSpec) -> Result<NodeHandle, String> {
        spec.validate()?;
        let id = spec.id;
        let (tx, rx) = unbounded();
        // The logs and sockets are opened on the loop's own thread, which
        // owns them for good (an io_uring ring is not shared).
        let (opened_tx, opened) = bounded(1);
        let thread = std::thread::Builder::new()
            .name(format!("quire-node-{id}"))
            .spawn(move || match EventLoop::open(spec, rx) {
                Ok(mut ev) => {
                    let _ = opened_tx.send(Ok(()));
                    ev.run();
                }
                Err(e) => {
                    let _ = opened_tx.send(Err(e));
                }
            })
            .map_err(|e| format!("starting the node thread: {e}"))?;
        let opened = opened
            .recv()
            .unwrap_or_else(|_| Err("the node thread died while opening".into()));
        if let Err(e) = opened {
            let _ = thread.join();
            return Err(e);
        }
        Ok(NodeHandle {
            id,
            commands: tx,
            thread: Some(thread),
        })
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
        let (reply, answer) = bounded(1);
        self.commands
            .send(Command::Propose { group, data, reply })
            .map_err(|_| ProposeError::Unavailable("node stopped".into()))?;
        answer
            .recv_timeout(timeout)
            .unwrap_or(Err(ProposeError::Timeout))
    }

    /// The node's state now; `None` if the loop has stopped.
    pub fn status(&self) -> Option<NodeStatus> {
        let (reply, answer) = bounded(1);
        self.commands.send(Command::Status(reply)).ok()?;
        answer.recv_timeout(Duration::from_secs(5)).ok()
    }

    /// Stops the loop: in-flight flushes finish, then it exits.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        let _ = self.commands.send(Command::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for NodeHandle {
    fn drop(&mut self) {
        self.stop_inner();
    }
}
