//! Cuts a byte stream into whole frames, in one buffer that never holds
//! more than `buffer_bytes_max` bytes (at most `frame_bytes_max`).
//!
//! Shared by both ends of a connection. The buffer grows with the bytes
//! actually received, never with what a length prefix announces, and a
//! prefix that announces too much is an error as soon as its four bytes are
//! in. Backpressure is explicit: [`Framer::push`] takes only what fits and
//! says how much, so a peer that sends faster than the caller serves just
//! fills the buffer and then the socket's.

use super::wire::{frame_bytes, DecodeError, LEN_BYTES};

/// The bounded reassembly buffer of one connection direction.
#[derive(Debug)]
pub(crate) struct Framer {
    /// Received bytes; `buf[start..]` is not yet handed out as frames.
    buf: Vec<u8>,
    start: usize,
    /// Largest frame a length prefix may announce.
    frame_bytes_max: usize,
    /// Most bytes held; a frame above it can never complete, so the owner
    /// must reject such frames from their header (see `ServerSession`).
    buffer_bytes_max: usize,
}

impl Framer {
    pub(crate) fn new(frame_bytes_max: usize, buffer_bytes_max: usize) -> Framer {
        debug_assert!(buffer_bytes_max <= frame_bytes_max);
        Framer {
            buf: Vec::new(),
            start: 0,
            frame_bytes_max,
            buffer_bytes_max,
        }
    }

    /// Raises the buffer bound (never above `frame_bytes_max`).
    pub(crate) fn set_buffer_bytes_max(&mut self, buffer_bytes_max: usize) {
        debug_assert!(buffer_bytes_max <= self.frame_bytes_max);
        debug_assert!(buffer_bytes_max >= self.buffer_bytes_max);
        self.buffer_bytes_max = buffer_bytes_max;
    }

    /// The bytes received and not yet handed out, starting with the next frame.
    pub(crate) fn head(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Bytes received and not yet handed out.
    pub(crate) fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Bytes the buffer has allocated; never above `buffer_bytes_max`.
    pub(crate) fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Copies as much of `bytes` as fits under the bound and returns how
    /// many; 0 means "hand out the waiting frame first".
    pub(crate) fn push(&mut self, bytes: &[u8]) -> usize {
        if self.start > 0 {
            // Frames before `start` were handed out by reference, and those
            // references have ended: reclaim their space.
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let take = bytes.len().min(self.buffer_bytes_max - self.buf.len());
        let need = self.buf.len() + take;
        if need > self.buf.capacity() {
            // Grow geometrically for throughput, but clamp to the bound, so
            // no peer can make us hold more than one largest frame.
            let cap = need
                .max(self.buf.capacity() * 2)
                .max(4096)
                .min(self.buffer_bytes_max);
            self.buf.reserve_exact(cap - self.buf.len());
        }
        self.buf.extend_from_slice(&bytes[..take]);
        debug_assert!(self.buf.len() <= self.buffer_bytes_max);
        take
    }

    /// Checks the length prefix of the next frame, if its four bytes are in.
    pub(crate) fn check_head(&self) -> Result<Option<usize>, DecodeError> {
        let Some(prefix) = self.buf.get(self.start..self.start + LEN_BYTES) else {
            return Ok(None);
        };
        let prefix: [u8; LEN_BYTES] = prefix.try_into().expect("slice of LEN_BYTES");
        frame_bytes(prefix, self.frame_bytes_max).map(Some)
    }

    /// The next whole frame (prefix included), if it is all in.
    pub(crate) fn next_frame(&mut self) -> Result<Option<&[u8]>, DecodeError> {
        let Some(total) = self.check_head()? else {
            return Ok(None);
        };
        if self.buffered() < total {
            return Ok(None);
        }
        let frame = &self.buf[self.start..self.start + total];
        self.start += total;
        Ok(Some(frame))
    }

    /// Drops everything buffered and the allocation: after a fatal error.
    pub(crate) fn clear(&mut self) {
        self.buf = Vec::new();
        self.start = 0;
    }
}
