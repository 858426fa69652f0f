//! I/O backends: the flush path of the log. Each group commit's write and
//! fdatasync, the superblock written with it, and reads of batches go
//! through a backend. The WAL (`storage::wal`) makes the log's other file
//! syscalls itself, off that path: opening and locking the directory,
//! recovery's reads, laying out, renaming and unlinking segments, writing
//! the snapshot slots, and the image builder's plain reads. io_uring here
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

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::io;
use std::os::fd::RawFd;
use std::time::Instant;

/// Alignment of I/O buffers: O_DIRECT wants the device's logical block.
pub const IO_ALIGN_BYTES: usize = 4096;

/// A growable heap buffer aligned to [`IO_ALIGN_BYTES`], as O_DIRECT
/// requires. Reused across flushes so the hot path does not allocate.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    cap: usize,
}

// The buffer is plain owned memory; moving it between threads is safe.
unsafe impl Send for AlignedBuf {}

fn aligned_cap(n: usize) -> usize {
    n.max(1).div_ceil(IO_ALIGN_BYTES) * IO_ALIGN_BYTES
}

impl AlignedBuf {
    /// An empty buffer with room for `cap` bytes.
    pub fn with_capacity(cap: usize) -> Self {
        let cap = aligned_cap(cap);
        let layout = Layout::from_size_align(cap, IO_ALIGN_BYTES).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len: 0, cap }
    }

    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        let mut b = Self::with_capacity(len);
        b.len = len; // alloc_zeroed: already zero
        b
    }

    /// A buffer holding a copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut b = Self::with_capacity(bytes.len());
        b.extend_from_slice(bytes);
        b
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes it can hold without growing.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets the contents, keeping the memory.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    fn reserve(&mut self, extra: usize) {
        let need = self.len + extra;
        if need <= self.cap {
            return;
        }
        let mut bigger = Self::with_capacity(need.max(self.cap * 2));
        bigger.extend_from_slice(self.as_slice());
        *self = bigger;
    }

    /// Appends `bytes`, growing if needed.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.reserve(bytes.len());
        // SAFETY: reserve made room for bytes.len() more bytes; the
        // regions cannot overlap (we own ours exclusively).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().add(self.len),
                bytes.len(),
            );
        }
        self.len += bytes.len();
    }

    /// Grows to `new_len` with zeros (or shrinks).
    pub fn resize_zeroed(&mut self, new_len: usize) {
        if new_len > self.len {
            self.reserve(new_len - self.len);
            // SAFETY: within capacity after reserve.
            unsafe {
                std::ptr::write_bytes(self.ptr.as_ptr().add(self.len), 0, new_len - self.len)
            };
        }
        self.len = new_len;
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for `len` initialised bytes.
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
        let layout = Layout::from_size_align(self.cap, IO_ALIGN_BYTES).expect("valid layout");
        // SAFETY: allocated in `with_capacity` with this very layout.
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
