//! Why a run, a job or an operation failed: typed, so a caller can tell a
//! usage error (exit code 2) from a host or cluster failure, and an
//! operation's error kind (counted, never fatal) from a job's. Each
//! message says what was being done; the error it wraps is its source.

use super::options::UsageError;
use crate::client::ClientError;
use crate::net::nft::NftError;
use crate::net::xdp::XdpError;
use crate::node::local::error::LocalClusterError;
use crate::state::Outcome;
use crate::storage::WalError;
use crate::tls::TlsFileError;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// What drawing the `--plot` picture can fail with (plotters' SVG backend).
pub type PlotError = plotters::drawing::DrawingAreaErrorKind<io::Error>;

/// Why a run or one job of it failed.
#[derive(Debug)]
pub enum BenchError {
    /// A bad flag, job file or option (combination): exit code 2.
    Usage(UsageError),
    /// A file, directory, socket or thread could not be had.
    Io {
        /// What was being done.
        what: String,
        /// The OS's answer.
        source: io::Error,
    },
    /// A server address did not resolve (`source` is `None` if it
    /// resolved to no address at all).
    Address {
        /// The address as given.
        addr: String,
        /// The resolver's error.
        source: Option<io::Error>,
    },
    /// The embedded cluster found no daemon binary next to quire-bench.
    NoDaemon {
        /// Where it looked.
        bin_dir: PathBuf,
    },
    /// The embedded cluster could not be prepared or started.
    Cluster(LocalClusterError),
    /// The embedded cluster did not elect a leader.
    NoLeader {
        /// The cluster's directory, where its logs are.
        dir: PathBuf,
        /// The warm-up append's error.
        source: ClientError,
    },
    /// The CA file of `--ca` could not be loaded.
    Tls(TlsFileError),
    /// A client call needed before the run (a queue, a ledger, a
    /// prefill) failed.
    Client {
        /// What was being done.
        what: String,
        /// The client's error.
        source: ClientError,
    },
    /// The producer or command pipeline took no request.
    Send {
        /// What was sent: `appends`, `commands`.
        what: &'static str,
        /// Why it was refused.
        source: crate::client::SendError,
    },
    /// The wal engine's log failed.
    Wal {
        /// What was being done.
        what: String,
        /// The log's error.
        source: WalError,
    },
    /// The udp engine's transport endpoint refused its config.
    Transport(crate::transport::ConfigError),
    /// The udp engine's transport refused a message.
    TransportSend(crate::transport::SendError),
    /// The udp engine's namespaces or loss rule could not be set up.
    Nft {
        /// What was being set up.
        what: String,
        /// Why nftables (or ip) refused.
        source: NftError,
    },
    /// `net_backend=xdp` and AF_XDP cannot be used.
    Xdp(XdpError),
    /// A helper thread of an engine went away.
    Stopped(&'static str),
    /// A helper thread of an engine panicked.
    Panicked(&'static str),
    /// The engine completed an operation twice, or one it was not given.
    UnknownCompletion(u64),
    /// An engine was driven out of order (a bug of the runner).
    Misuse(&'static str),
    /// The `--plot` picture could not be drawn.
    Plot {
        /// The picture's file.
        path: PathBuf,
        /// What plotters said.
        source: PlotError,
    },
    /// A job thread panicked.
    JobPanicked,
}

impl BenchError {
    /// A map_err for an I/O error while doing `what`.
    pub(super) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> BenchError {
        let what = what.into();
        move |source| BenchError::Io { what, source }
    }

    /// A map_err for a WAL error while doing `what`.
    pub(super) fn wal(what: impl Into<String>) -> impl FnOnce(WalError) -> BenchError {
        let what = what.into();
        move |source| BenchError::Wal { what, source }
    }

    /// A map_err for a client error while doing `what`.
    pub(super) fn client(what: impl Into<String>) -> impl FnOnce(ClientError) -> BenchError {
        let what = what.into();
        move |source| BenchError::Client { what, source }
    }

    /// A usage error saying `why`.
    pub(super) fn usage(why: impl Into<String>) -> BenchError {
        BenchError::Usage(UsageError(why.into()))
    }

    /// True for a bad flag, job file or option (quire-bench exits 2).
    pub fn is_usage(&self) -> bool {
        matches!(self, BenchError::Usage(_))
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Usage(e) => e.fmt(f),
            BenchError::Io { what, source } => write!(f, "{what}: {source}"),
            BenchError::Address { addr, source } => match source {
                Some(e) => write!(f, "address {addr:?}: {e}"),
                None => write!(f, "address {addr:?} resolves to nothing"),
            },
            BenchError::NoDaemon { bin_dir } => write!(
                f,
                "--embedded starts the daemon binary next to quire-bench, and neither quired nor quire is in {} (cargo build --bins)",
                bin_dir.display()
            ),
            BenchError::Cluster(e) => e.fmt(f),
            BenchError::NoLeader { dir, source } => write!(
                f,
                "the embedded cluster did not elect a leader: {source} (logs in {})",
                dir.display()
            ),
            BenchError::Tls(e) => e.fmt(f),
            BenchError::Client { what, source } => write!(f, "{what}: {source}"),
            BenchError::Send { what, source } => match source {
                // The runner keeps at most iodepth = pending_max in flight.
                crate::client::SendError::Full => write!(f, "more {what} in flight than iodepth"),
                e => e.fmt(f),
            },
            BenchError::Wal { what, source } => write!(f, "{what}: {source}"),
            BenchError::Transport(e) => write!(f, "transport endpoint: {e}"),
            BenchError::TransportSend(e) => write!(f, "send: {e}"),
            BenchError::Nft { what, source } => write!(f, "{what}: {source}"),
            BenchError::Xdp(e) => write!(f, "net_backend=xdp: {e}"),
            BenchError::Stopped(what) => write!(f, "{what} stopped"),
            BenchError::Panicked(what) => write!(f, "{what} panicked"),
            BenchError::UnknownCompletion(id) => write!(
                f,
                "the engine completed operation {id} twice, or one it was never given"
            ),
            BenchError::Misuse(what) => f.write_str(what),
            BenchError::Plot { path, source } => {
                write!(f, "drawing {}: {source}", path.display())
            }
            BenchError::JobPanicked => f.write_str("the job thread panicked"),
        }
    }
}

impl std::error::Error for BenchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BenchError::Usage(e) => Some(e),
            BenchError::Io { source, .. } => Some(source),
            BenchError::Address { source, .. } => source
                .as_ref()
                .map(|e| e as &(dyn std::error::Error + 'static)),
            BenchError::Cluster(e) => Some(e),
            BenchError::NoLeader { source, .. } | BenchError::Client { source, .. } => Some(source),
            BenchError::Tls(e) => Some(e),
            BenchError::Send { source, .. } => Some(source),
            BenchError::Wal { source, .. } => Some(source),
            BenchError::Transport(e) => Some(e),
            BenchError::TransportSend(e) => Some(e),
            BenchError::Nft { source, .. } => Some(source),
            BenchError::Xdp(e) => Some(e),
            BenchError::Plot { source, .. } => Some(source),
            BenchError::NoDaemon { .. }
            | BenchError::Stopped(_)
            | BenchError::Panicked(_)
            | BenchError::UnknownCompletion(_)
            | BenchError::Misuse(_)
            | BenchError::JobPanicked => None,
        }
    }
}

impl From<UsageError> for BenchError {
    fn from(e: UsageError) -> Self {
        BenchError::Usage(e)
    }
}

impl From<LocalClusterError> for BenchError {
    fn from(e: LocalClusterError) -> Self {
        BenchError::Cluster(e)
    }
}

impl From<TlsFileError> for BenchError {
    fn from(e: TlsFileError) -> Self {
        BenchError::Tls(e)
    }
}

/// Why one operation failed: counted by kind in the job's results, never
/// fatal to the job. Its `Display` is the kind, a short stable label
/// (`unavailable`, `refused:TOO_LARGE`, `queue-empty`...).
#[derive(Clone, Debug)]
pub enum OpError {
    /// A cluster call failed.
    Client(ClientError),
    /// A command came back with an outcome of another kind.
    UnexpectedOutcome(Box<Outcome>),
    /// A consume found the queue empty, several times in a row.
    QueueEmpty,
    /// A wal read came before anything was durable.
    NothingDurable,
    /// A wal read failed.
    WalRead(Arc<WalError>),
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpError::Client(ClientError::Unavailable(_)) => f.write_str("unavailable"),
            OpError::Client(ClientError::Refused(code, _)) => write!(f, "refused:{code}"),
            OpError::UnexpectedOutcome(o) => write!(f, "unexpected-outcome:{o:?}"),
            OpError::QueueEmpty => f.write_str("queue-empty"),
            OpError::NothingDurable => f.write_str("read: nothing durable yet"),
            OpError::WalRead(e) => write!(f, "read: {e}"),
        }
    }
}

impl std::error::Error for OpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpError::Client(e) => Some(e),
            OpError::WalRead(e) => Some(e.as_ref()),
            OpError::UnexpectedOutcome(_) | OpError::QueueEmpty | OpError::NothingDurable => None,
        }
    }
}

impl From<ClientError> for OpError {
    fn from(e: ClientError) -> Self {
        OpError::Client(e)
    }
}
