//! What an [`Endpoint`] hands back to its caller: datagrams to transmit,
//! events to act on, and the reasons it refuses a message or drops a
//! datagram. Plain data.

use super::wire::DecodeError;
#[cfg(doc)]
use super::Endpoint;
use super::GroupId;
use crate::consensus::NodeId;

/// A datagram [`Endpoint::poll_transmit`] wrote into the caller's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// The node to send it to.
    pub peer: NodeId,
    /// Group of its first frame: send from, and to, that group's socket
    /// (`base_port + group`). `None` for an epoch announcement without
    /// frames, which any socket of the peer may carry.
    pub group: Option<GroupId>,
    /// Length of the datagram at the start of the buffer, in bytes.
    pub size_bytes: usize,
}

/// Something the caller must act on; see [`Endpoint::poll_event`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A message, complete, in order, exactly once per channel.
    Delivered {
        /// Sender.
        peer: NodeId,
        /// Group.
        group: GroupId,
        /// The message bytes as given to `send`.
        message: Vec<u8>,
    },
    /// The messages that used seqs `first_seq..=last_seq` of this channel
    /// will never be delivered: the sender no longer held them. Consensus
    /// recovers them its own way (a rejected append, a snapshot).
    Skipped {
        /// Sender.
        peer: NodeId,
        /// Group.
        group: GroupId,
        /// First seq skipped.
        first_seq: u64,
        /// Last seq skipped.
        last_seq: u64,
    },
    /// The window of a channel that refused a `send` is open again.
    Writable {
        /// Peer.
        peer: NodeId,
        /// Group.
        group: GroupId,
    },
    /// The peer restarted (a new session epoch): what was in flight either
    /// way is lost, and channels with it start over.
    PeerRestarted {
        /// The peer.
        peer: NodeId,
    },
}

/// Why `send` refused a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    /// The channel's window is full: stop producing for this peer and
    /// group until [`Event::Writable`].
    WouldBlock,
    /// The message is larger than `message_bytes_max`.
    TooLarge {
        /// Message length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// Node id 0, or this node itself.
    InvalidPeer,
    /// A new peer beyond `peers_max`.
    TooManyPeers,
    /// A new channel beyond `channels_max`.
    TooManyChannels,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::WouldBlock => write!(f, "flow-control window full"),
            SendError::TooLarge { len, max } => {
                write!(
                    f,
                    "message of {len} bytes exceeds message_bytes_max ({max})"
                )
            }
            SendError::InvalidPeer => write!(f, "invalid peer (0 or this node)"),
            SendError::TooManyPeers => write!(f, "more peers than peers_max"),
            SendError::TooManyChannels => write!(f, "more channels than channels_max"),
        }
    }
}

impl std::error::Error for SendError {}

/// Why a datagram was dropped whole. Every drop is also counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Not a valid, authentic datagram.
    Decode(DecodeError),
    /// For another node, or claiming to come from this one.
    Misaddressed,
    /// From a new peer beyond `peers_max`.
    TooManyPeers,
    /// From an earlier life of the sender, or for an earlier life of ours.
    StaleEpoch,
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DropReason::Decode(e) => write!(f, "{e}"),
            DropReason::Misaddressed => write!(f, "datagram for another node"),
            DropReason::TooManyPeers => write!(f, "more peers than peers_max"),
            DropReason::StaleEpoch => write!(f, "datagram of an earlier session"),
        }
    }
}

impl std::error::Error for DropReason {}
