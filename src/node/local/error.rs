//! Why a local cluster could not be prepared or started: typed, so a
//! caller can tell a file or port it could not get (I/O), the OS's random
//! source refusing, a certificate that could not be made, and a node that
//! refused to start, and each says what was being done.

use crate::consensus::NodeId;
use crate::entropy::EntropyError;
use crate::node::errors::StartError;
use crate::tls::issue::IssueError;
use crate::tls::TlsFileError;
use std::fmt;
use std::io;
use std::path::PathBuf;

/// Why [`LocalProcesses`](super::processes::LocalProcesses) or
/// [`LocalCluster`](super::in_process::LocalCluster) failed.
#[derive(Debug)]
pub enum LocalClusterError {
    /// A file, directory, cable, port or process could not be had.
    Io {
        /// What was being done (a file name, "finding UDP ports"...).
        what: String,
        /// The OS's answer.
        source: io::Error,
    },
    /// A path that goes into a config file is not UTF-8.
    NotUtf8(PathBuf),
    /// A key or token could not be minted: the OS's random source failed.
    Entropy {
        /// The key or token.
        what: &'static str,
        /// The random source's error.
        source: EntropyError,
    },
    /// The local CA or a node certificate could not be made.
    Certificate(IssueError),
    /// The CA file the cluster wrote could not be loaded.
    Tls(TlsFileError),
    /// No node has this id.
    NoSuchNode(NodeId),
    /// An in-process node refused to start.
    Start(StartError),
}

impl LocalClusterError {
    /// A map_err for an I/O error while doing `what`.
    pub(super) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> LocalClusterError {
        let what = what.into();
        move |source| LocalClusterError::Io { what, source }
    }
}

impl fmt::Display for LocalClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LocalClusterError::Io { what, source } => write!(f, "{what}: {source}"),
            LocalClusterError::NotUtf8(p) => write!(f, "{}: the path is not UTF-8", p.display()),
            LocalClusterError::Entropy { what, source } => write!(f, "{what}: {source}"),
            LocalClusterError::Certificate(e) => e.fmt(f),
            LocalClusterError::Tls(e) => e.fmt(f),
            LocalClusterError::NoSuchNode(id) => write!(f, "no such node: {id}"),
            LocalClusterError::Start(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for LocalClusterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LocalClusterError::Io { source, .. } => Some(source),
            LocalClusterError::Entropy { source, .. } => Some(source),
            LocalClusterError::Certificate(e) => Some(e),
            LocalClusterError::Tls(e) => Some(e),
            LocalClusterError::Start(e) => Some(e),
            LocalClusterError::NotUtf8(_) | LocalClusterError::NoSuchNode(_) => None,
        }
    }
}

impl From<IssueError> for LocalClusterError {
    fn from(e: IssueError) -> Self {
        LocalClusterError::Certificate(e)
    }
}

impl From<TlsFileError> for LocalClusterError {
    fn from(e: TlsFileError) -> Self {
        LocalClusterError::Tls(e)
    }
}

impl From<StartError> for LocalClusterError {
    fn from(e: StartError) -> Self {
        LocalClusterError::Start(e)
    }
}
