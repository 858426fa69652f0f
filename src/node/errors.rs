//! Why a node or one of its servers did not start: typed, so that the
//! daemon tells a bad config and a taken port (exit code 2: restarting
//! does not help until the operator acts) from a failure of the host
//! (exit code 1). Each message names what could not be opened.

use crate::node::spec::SpecError;
use crate::storage::WalError;
use crate::transport::GroupId;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Why [`NodeHandle::spawn`](super::NodeHandle::spawn) refused or failed.
#[derive(Debug)]
pub enum StartError {
    /// The spec is not one a node can run: a bad config, found before
    /// any log was opened or socket bound.
    Spec(SpecError),
    /// A group's log could not be opened or recovered.
    Log {
        /// The group.
        group: GroupId,
        /// Its log directory.
        dir: PathBuf,
        /// What the log said.
        error: WalError,
    },
    /// A group's snapshot does not decode: its state cannot be restored,
    /// and applying the log from an empty state would diverge.
    SnapshotUndecodable {
        /// The group.
        group: GroupId,
        /// Its log directory.
        dir: PathBuf,
        /// The snapshot's index.
        index: u64,
    },
    /// The group sockets could not be bound (`AddrInUse`: a port taken).
    Udp(io::Error),
    /// The OS refused a resource the loops need (a thread, an eventfd).
    Os {
        /// What was being created.
        what: &'static str,
        /// The OS's answer.
        error: io::Error,
    },
    /// A loop thread ended while opening (it panicked; the panic message
    /// went to stderr).
    LoopDied,
    /// `net.backend = "xdp"` and AF_XDP cannot be used here: why.
    Xdp(crate::net::xdp::XdpError),
}

impl StartError {
    /// True if the config is at fault (the operator must change it), not
    /// the host: the daemon exits with 2 for these.
    pub fn is_config(&self) -> bool {
        matches!(self, StartError::Spec(_))
    }
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Spec(e) => write!(f, "bad node spec: {e}"),
            StartError::Log { group, dir, error } => {
                write!(f, "group {group} log at {}: {error}", dir.display())
            }
            StartError::SnapshotUndecodable { group, dir, index } => write!(
                f,
                "group {group} log at {}: the snapshot at {index} does not decode",
                dir.display()
            ),
            StartError::Udp(e) => write!(f, "udp: {e}"),
            StartError::Os { what, error } => write!(f, "{what}: {error}"),
            StartError::LoopDied => write!(f, "a node thread died while opening"),
            StartError::Xdp(why) => write!(
                f,
                "net.backend = \"xdp\" but AF_XDP cannot be used: {why} (\"auto\" would run on sockets)"
            ),
        }
    }
}

impl std::error::Error for StartError {}

impl From<SpecError> for StartError {
    fn from(e: SpecError) -> Self {
        StartError::Spec(e)
    }
}

/// Why the client server or the admin endpoint did not start.
#[derive(Debug)]
pub enum ListenError {
    /// The connection bounds cannot work (the `[client]` section): a bad
    /// config.
    Limits(String),
    /// The listener could not be bound (`AddrInUse`: the port is taken).
    Bind {
        /// Which server: "the client server", "the admin endpoint".
        server: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// The OS's answer.
        error: io::Error,
    },
    /// The server's thread could not be started.
    Thread(io::Error),
}

impl ListenError {
    /// True if the config is at fault, not the host (exit code 2).
    pub fn is_config(&self) -> bool {
        matches!(self, ListenError::Limits(_))
    }
}

impl fmt::Display for ListenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenError::Limits(why) => write!(f, "client limits: {why}"),
            ListenError::Bind {
                server,
                addr,
                error,
            } => write!(f, "{server} on {addr}: {error}"),
            ListenError::Thread(e) => write!(f, "starting the server thread: {e}"),
        }
    }
}

impl std::error::Error for ListenError {}
