//! A loop's wake-up: an eventfd in the loop's poll set. Whoever hands the
//! loop work from another thread (a command, a message from another core)
//! signals it after sending, the loop's WAL signals it on every completed
//! flush, and a replica's offloaded job once its result is in, so the
//! loop sleeps in poll(2) until there is something to do instead of
//! polling on a short timer.

use nix::sys::eventfd::{EfdFlags, EventFd};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

/// A shared handle on one loop's eventfd.
#[derive(Clone, Debug)]
pub(crate) struct Waker(Arc<EventFd>);

impl Waker {
    /// A new eventfd (non-blocking, close-on-exec).
    pub(crate) fn new() -> std::io::Result<Waker> {
        let fd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(Waker(Arc::new(fd)))
    }

    /// Wakes the loop (cheap; wake-ups coalesce). A full counter (EAGAIN)
    /// already wakes it.
    pub(crate) fn wake(&self) {
        let _ = self.0.write(1);
    }

    /// Clears pending wake-ups (the loop, before it looks for work);
    /// EAGAIN if there were none.
    pub(crate) fn drain(&self) {
        let _ = self.0.read();
    }

    /// The descriptor, for the poll set and the WAL's notifications.
    pub(crate) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}
