//! Aligned byte buffers: what the log's format encodes into and the I/O
//! backends hand to the kernel. Pure memory, no I/O, so the sans-IO format
//! code depends on this and not on the backends (`crate::io` re-exports it).

use std::alloc::{alloc_zeroed, dealloc, Layout};

/// Alignment of I/O buffers: O_DIRECT wants the device's logical block.
pub const IO_ALIGN_BYTES: usize = 4096;

/// A growable heap buffer aligned to [`IO_ALIGN_BYTES`], as O_DIRECT
/// requires. Reused across flushes so the hot path does not allocate.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: the buffer is plain memory it owns alone (no shared or
// thread-bound state), so moving it between threads is safe.
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

    /// The start of the bytes, for a syscall or an io_uring entry.
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The start of the bytes, writable, for a read into the buffer.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
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
