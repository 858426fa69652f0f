//! I/O backends: the flush path of the log. Each group commit's write and
//! fdatasync, the superblock written with it, and reads of batches go
//! through a backend. The WAL (`storage::wal`) makes the log's other file
//! syscalls itself, off that path: opening and locking the directory,
//! recovery's reads, laying out, renaming and unlinking segments, writing
//! the snapshot slots, and the plain reads of image chunks for followers. io_uring here
//! is for the disk only; sockets are polled with `ppoll` (`crate::net`).
//!
//! A request is a short chain of operations (write, fdatasync, read) run in
//! order; if one fails, the rest are not run, and the request completes with
//! the first error. Two backends run the same requests:
//! - [`uring::UringBackend`]: io_uring, the chain linked with IOSQE_IO_LINK
//!   so a write and its fdatasync go to the kernel in one submission;
//! - [`portable::PortableBackend`]: pwrite + fdatasync on a helper thread,
//!   for kernels without io_uring or where it is disabled or filtered.
//!
//! Only the thread that owns a backend touches it.

pub mod portable;
pub mod private;
pub mod uring;

pub use crate::buf::{AlignedBuf, IO_ALIGN_BYTES};

use std::io;
use std::os::fd::RawFd;

/// One operation of a request.
pub enum IoOp {
    /// Write the whole buffer at `offset`.
    Write {
        /// File descriptor.
        fd: RawFd,
        /// Byte offset.
        offset: u64,
        /// Data; returned in the completion for reuse.
        buf: AlignedBuf,
    },
    /// fdatasync the file.
    Fdatasync {
        /// File descriptor.
        fd: RawFd,
    },
    /// Read `len` bytes at `offset`; the data comes back in the completion.
    Read {
        /// File descriptor.
        fd: RawFd,
        /// Byte offset.
        offset: u64,
        /// Bytes to read.
        len: usize,
    },
}

/// A chain of operations run in order.
pub struct IoRequest {
    /// Caller's id, echoed in the completion.
    pub token: u64,
    /// The operations.
    pub ops: Vec<IoOp>,
}

/// The outcome of a request.
pub struct IoCompletion {
    /// The request's token.
    pub token: u64,
    /// Ok, or the first error (later operations did not run).
    pub result: io::Result<()>,
    /// Buffers of the request: written ones back, read ones filled.
    pub bufs: Vec<AlignedBuf>,
}

/// Runs I/O requests asynchronously.
pub trait IoBackend {
    /// Short name for logs and status: "io_uring" or "portable".
    fn name(&self) -> &'static str;
    /// Queues a request and hands it to the kernel or the helper thread.
    fn submit(&mut self, req: IoRequest) -> io::Result<()>;
    /// Collects finished requests into `out`; with `wait`, blocks until at
    /// least one finishes (if any is in flight).
    fn reap(&mut self, wait: bool, out: &mut Vec<IoCompletion>) -> io::Result<()>;
    /// Requests submitted and not yet reaped.
    fn in_flight(&self) -> usize;
    /// From now on, every completion also signals the eventfd `fd`, so an
    /// event loop waiting in poll(2) wakes for it.
    fn notify_completions(&mut self, fd: std::os::fd::RawFd) -> io::Result<()>;
}

/// Which backend to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// io_uring if it can be set up, else the portable backend.
    Auto,
    /// io_uring or fail.
    IoUring,
    /// The portable backend.
    Portable,
}

impl std::str::FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(BackendChoice::Auto),
            "io_uring" | "uring" => Ok(BackendChoice::IoUring),
            "portable" => Ok(BackendChoice::Portable),
            _ => Err(format!(
                "unknown I/O backend '{s}' (auto, io_uring, portable)"
            )),
        }
    }
}

/// Opens the chosen backend. Returns it with a sentence saying which one
/// is active and why, for the log.
pub fn open_backend(
    choice: BackendChoice,
    queue_depth: u32,
) -> io::Result<(Box<dyn IoBackend>, String)> {
    match choice {
        BackendChoice::Portable => Ok((
            Box::new(portable::PortableBackend::new()?),
            "portable backend (pwrite + fdatasync on a helper thread): chosen by configuration"
                .into(),
        )),
        BackendChoice::IoUring => {
            let b = uring::UringBackend::new(queue_depth).map_err(uring::explain_setup_error)?;
            Ok((
                Box::new(b),
                "io_uring backend: chosen by configuration".into(),
            ))
        }
        BackendChoice::Auto => match uring::UringBackend::new(queue_depth) {
            Ok(b) => Ok((Box::new(b), "io_uring backend: available".into())),
            Err(e) => {
                let why = uring::explain_setup_error(e);
                Ok((
                    Box::new(portable::PortableBackend::new()?),
                    format!("portable backend (pwrite + fdatasync on a helper thread): {why}"),
                ))
            }
        },
    }
}
