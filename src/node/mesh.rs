//! The inter-core mesh of one node: what its loops tell each other
//! (`CoreMsg`) and how a loop reaches another (`CoreMailbox`: a channel
//! and that loop's eventfd). The control loop has a mailbox to every
//! worker, each worker one to the control loop (`Wiring`); nothing else
//! crosses cores, and no lock is taken.

use super::waker::Waker;
use crate::consensus::NodeId;
use crate::heartbeat::{Event as LinkEvent, GroupStatus, Heartbeat};
use crossbeam_channel::Sender;

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
