//! A loop's wake-up: an eventfd in the loop's poll set. Whoever hands the
//! loop work from another thread (a command, a message from another core)
//! signals it after sending, the loop's WAL signals it on every completed
//! flush, and a replica's offloaded job once its result is in, so the
//! loop sleeps in poll(2) until there is something to do instead of
//! polling on a short timer.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// A shared handle on one loop's eventfd.
#[derive(Clone, Debug)]
pub(crate) struct Waker(Arc<OwnedFd>);

impl Waker {
    /// A new eventfd (non-blocking, close-on-exec).
    pub(crate) fn new() -> std::io::Result<Waker> {
        // SAFETY: eventfd has no memory arguments; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        Ok(Waker(Arc::new(unsafe { OwnedFd::from_raw_fd(fd) })))
    }

    /// Wakes the loop (cheap; wake-ups coalesce).
    pub(crate) fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our eventfd.
        unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    /// Clears pending wake-ups (the loop, before it looks for work).
    pub(crate) fn drain(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live buffer; EAGAIN if none.
        unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
    }

    /// The descriptor, for the poll set and the WAL's notifications.
    pub(crate) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}
