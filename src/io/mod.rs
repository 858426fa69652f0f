//! I/O backends: the only code that makes file syscalls for the log.
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
pub mod uring;

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::io;
use std::os::fd::RawFd;
use std::time::Instant;

/// Alignment of I/O buffers: O_DIRECT wants the device's logical block.
pub const IO_ALIGN_BYTES: usize = 4096;

/// A heap buffer aligned to [`IO_ALIGN_BYTES`], as O_DIRECT requires.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// The buffer is plain owned memory; moving it between threads is safe.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (rounded up to the alignment).
    pub fn zeroed(len: usize) -> Self {
        let cap = len.max(1).div_ceil(IO_ALIGN_BYTES) * IO_ALIGN_BYTES;
        let layout = Layout::from_size_align(cap, IO_ALIGN_BYTES).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    /// A buffer holding a copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut b = Self::zeroed(bytes.len());
        b.as_mut_slice().copy_from_slice(bytes);
        b
    }

    fn capacity(&self) -> usize {
        self.len.max(1).div_ceil(IO_ALIGN_BYTES) * IO_ALIGN_BYTES
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for `len` initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we hold the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout =
            Layout::from_size_align(self.capacity(), IO_ALIGN_BYTES).expect("valid layout");
        // SAFETY: allocated in `zeroed` with this very layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

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
    /// When the request was submitted.
    pub submitted: Instant,
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
