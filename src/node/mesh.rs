//! The inter-core mesh of one node: what its loops tell each other
//! (`CoreMsg`) and how a loop reaches another (`CoreMailbox`: a channel
//! and that loop's eventfd). For the control plane, the control loop has
//! a mailbox to every worker and each worker one to the control loop
//! (`Wiring`). For client connections, which any loop may serve, every
//! loop reaches every loop (`Routing`): a request for a group another
//! loop owns goes to that loop as a command, and its outcome comes back
//! as a `CoreMsg`. No lock is taken.

use crate::api::Response;
use crate::consensus::NodeId;
use crate::heartbeat::{Event as LinkEvent, GroupStatus, Heartbeat};
use crate::node::command::{CoreCommand, TicketDone};
use crate::node::loops::waker::Waker;
use crate::transport::GroupId;
use crossbeam_channel::{Sender, TrySendError};
use std::collections::BTreeMap;

/// What the loops of one node tell each other.
pub(crate) enum CoreMsg {
    /// Worker to control: a peer was heard on one of the worker's sockets.
    HeardUdp { peer: NodeId },
    /// Worker to control: a heartbeat arrived on one of its sockets.
    Heartbeat(Box<Heartbeat>),
    /// Worker to control: the worker's groups, for the node's heartbeat.
    Groups(Vec<GroupStatus>),
    /// Control to worker: something the detector found.
    Detector(LinkEvent),
    /// Control to worker: a fresh peer heartbeat, and whether IP to that
    /// peer is alive.
    PeerHeartbeat(Box<Heartbeat>, bool),
    /// Owner to the serving loop: outcomes of client appends it handed
    /// over (`CoreCommand::ClientAppends`), a turn's worth at once.
    ClientDone(Vec<TicketDone>),
    /// To the serving loop: the answer to request `request` of its
    /// connection `conn` (in `generation`), for the calls that are not
    /// appends (reads, ledger and queue commands, status).
    ClientAnswer {
        conn: u32,
        generation: u32,
        request: u64,
        response: Response,
        /// A small answer (`NodeCall::answer_is_small`).
        small: bool,
    },
}

/// The mailbox of another core's loop (not a peer node): a sender of
/// `CoreMsg`, with that loop's wake-up.
#[derive(Clone)]
pub(crate) struct CoreMailbox {
    pub(crate) tx: Sender<CoreMsg>,
    pub(crate) waker: Waker,
}

impl CoreMailbox {
    /// Hands the loop `msg` and wakes it (dropped if that loop is gone).
    pub(crate) fn send(&self, msg: CoreMsg) {
        if self.tx.send(msg).is_ok() {
            self.waker.wake();
        }
    }
}

/// How a loop is wired to the node's other loops.
pub(crate) enum Wiring {
    /// The control loop, with a sender to every worker.
    Control(Vec<CoreMailbox>),
    /// A worker, with a sender to the control loop.
    Worker(CoreMailbox),
}

/// One loop as the others reach it for client requests: its commands
/// (bounded: `COMMANDS_QUEUED_MAX`) and its mailbox.
#[derive(Clone)]
pub(crate) struct CoreLink {
    pub(crate) commands: Sender<CoreCommand>,
    pub(crate) mail: CoreMailbox,
}

impl CoreLink {
    /// Hands the loop `cmd` without blocking (a loop never waits on
    /// another); gives it back if the loop's queue is full or it is gone.
    pub(crate) fn try_command(&self, cmd: CoreCommand) -> Result<(), CoreCommand> {
        match self.commands.try_send(cmd) {
            Ok(()) => {
                self.mail.waker.wake();
                Ok(())
            }
            Err(TrySendError::Full(cmd) | TrySendError::Disconnected(cmd)) => Err(cmd),
        }
    }
}

/// Every loop of the node, and which one owns each group: what a loop
/// serving client connections needs to reach the owner of a request's
/// group. Built once by the handle, shared read-only.
pub(crate) struct Routing {
    /// The loop owning each group.
    pub(crate) owner: BTreeMap<GroupId, usize>,
    /// Each loop, by its index.
    pub(crate) cores: Vec<CoreLink>,
}
