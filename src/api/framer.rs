//! Cuts a byte stream into whole frames, in one buffer that never holds
//! more than `buffer_bytes_max` bytes (at most `frame_bytes_max`).
//!
//! Shared by both ends of a connection. The buffer grows with the bytes
//! actually received, never with what a length prefix announces, and a
//! prefix that announces too much is an error as soon as its four bytes are
//! in. Backpressure is explicit: [`Framer::push`] takes only what fits and
//! says how much, so a peer that sends faster than the caller serves just
//! fills the buffer and then the socket's.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use bytes::{Bytes, BytesMut};

use super::wire::{frame_bytes, DecodeError, LEN_BYTES};

/// Space left in the buffer worth a read(2) of its own, rather than
/// making room first (see [`Framer::read_from`]).
const READ_SPARE_BYTES_MIN: usize = 16 << 10;

/// The bounded reassembly buffer of one connection direction.
#[derive(Debug)]
pub(crate) struct Framer {
    /// Received bytes not yet handed out as frames. A frame handed out is
    /// split off as a shared [`Bytes`] (a request's records reach the
    /// log without a copy of their own); the space comes back once it is
    /// dropped.
    buf: BytesMut,
    /// Bytes of the allocation `buf` lives in: the buffer's own growth
    /// is decided here, so it stays under `buffer_bytes_max`.
    allocated_bytes: usize,
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
            buf: BytesMut::new(),
            allocated_bytes: 0,
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
        &self.buf
    }

    /// Bytes received and not yet handed out.
    pub(crate) fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Bytes the buffer has allocated; never above `buffer_bytes_max`.
    /// (Frames handed out and still held keep their old allocation alive
    /// until dropped; the owner holds them only while it serves them.)
    pub(crate) fn capacity(&self) -> usize {
        self.allocated_bytes
    }

    /// Copies as much of `bytes` as fits under the bound and returns how
    /// many; 0 means "hand out the waiting frame first".
    pub(crate) fn push(&mut self, bytes: &[u8]) -> usize {
        let take = bytes.len().min(self.buffer_bytes_max - self.buf.len());
        if self.buf.capacity() - self.buf.len() < take {
            self.make_room(take);
        }
        self.buf.extend_from_slice(&bytes[..take]);
        debug_assert!(self.buf.len() <= self.buffer_bytes_max);
        take
    }

    /// Bytes the buffer can still take before a frame is handed out.
    pub(crate) fn room(&self) -> usize {
        self.buffer_bytes_max - self.buf.len()
    }

    /// Reads at most `want` bytes (and at most [`room`](Self::room)) from
    /// `fd` straight into the buffer, without a copy through a scratch
    /// buffer; `Ok(0)` is the end of the stream. With no room it reads
    /// nothing and says `WouldBlock`: hand out the waiting frame first.
    pub(crate) fn read_from(&mut self, fd: BorrowedFd<'_>, want: usize) -> io::Result<usize> {
        let take = want.min(self.room());
        if take == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        // Read into the space left while there is a fair amount of it:
        // making room moves the unfinished frame to the front, which for
        // every read was a copy of a tenth of the bytes received. The
        // buffer grows with the bytes that come (at most doubling), not
        // with what one read could bring, so an idle connection keeps a
        // few KiB.
        if self.buf.capacity() - self.buf.len() < take.min(READ_SPARE_BYTES_MIN) {
            self.make_room(take.min(self.allocated_bytes.max(4096)));
        }
        let spare = self.buf.spare_capacity_mut();
        let take = take.min(spare.len());
        if take == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        // SAFETY: `spare` is writable memory of at least `take` bytes that
        // `read(2)` fills from its start; only the `n` bytes it reports
        // written are then counted as initialised.
        let n = unsafe { libc::read(fd.as_raw_fd(), spare.as_mut_ptr().cast(), take) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        assert!(n <= take, "read(2) returned more than asked");
        // SAFETY: `read(2)` initialised these `n` bytes, within capacity.
        unsafe { self.buf.set_len(self.buf.len() + n) };
        Ok(n)
    }

    /// Makes room for `more` bytes after those buffered: in the same
    /// allocation once every frame handed out from it is dropped, or in a
    /// new one, grown geometrically for throughput but clamped to the
    /// bound, so no peer can make us hold more than one largest frame.
    fn make_room(&mut self, more: usize) {
        let need = self.buf.len() + more;
        let bytes = if need <= self.allocated_bytes {
            if self.buf.try_reclaim(more) {
                return;
            }
            // A frame handed out is still held, or the unfinished frame
            // is larger than the space before it: the same size again, no
            // growth. (The old allocation goes as this returns, unless a
            // held frame keeps it: one extra buffer per loop at a time.)
            self.allocated_bytes
        } else {
            need.max(self.allocated_bytes * 2)
                .max(4096)
                .min(self.buffer_bytes_max)
        };
        let mut grown = BytesMut::with_capacity(bytes);
        grown.extend_from_slice(&self.buf);
        self.allocated_bytes = grown.capacity();
        self.buf = grown;
    }

    /// Checks the length prefix of the next frame, if its four bytes are in.
    pub(crate) fn check_head(&self) -> Result<Option<usize>, DecodeError> {
        let Some(prefix) = self.buf.get(..LEN_BYTES) else {
            return Ok(None);
        };
        let prefix: [u8; LEN_BYTES] = prefix.try_into().expect("slice of LEN_BYTES");
        frame_bytes(prefix, self.frame_bytes_max).map(Some)
    }

    /// The next whole frame (prefix included), if it is all in.
    pub(crate) fn next_frame(&mut self) -> Result<Option<Bytes>, DecodeError> {
        let Some(total) = self.check_head()? else {
            return Ok(None);
        };
        if self.buffered() < total {
            return Ok(None);
        }
        Ok(Some(self.buf.split_to(total).freeze()))
    }

    /// Drops everything buffered and the allocation: after a fatal error.
    pub(crate) fn clear(&mut self) {
        self.buf = BytesMut::new();
        self.allocated_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame of `body` bytes (prefix included), all `fill`.
    fn frame(body: usize, fill: u8) -> Vec<u8> {
        let mut f = (body as u32).to_le_bytes().to_vec();
        f.resize(LEN_BYTES + body, fill);
        f
    }

    #[test]
    fn frames_handed_out_stay_intact_while_the_buffer_is_reused() {
        let bound = 64 * 1024;
        let mut framer = Framer::new(bound, bound);
        let mut held = Vec::new();
        for round in 0..200u32 {
            let f = frame(100 + (round as usize * 37) % 3000, round as u8);
            assert_eq!(framer.push(&f), f.len());
            let got = framer.next_frame().unwrap().expect("a whole frame");
            assert_eq!(&got[..], &f[..]);
            // Keep every third frame alive across later pushes.
            if round % 3 == 0 {
                held.push((got, f));
            }
            assert!(
                framer.capacity() <= bound,
                "{} > {bound}",
                framer.capacity()
            );
        }
        for (got, sent) in &held {
            assert_eq!(&got[..], &sent[..], "a held frame was overwritten");
        }
    }

    #[test]
    fn a_buffer_whose_frames_are_dropped_is_reused_not_reallocated() {
        let mut framer = Framer::new(1 << 20, 1 << 20);
        let f = frame(1000, 7);
        framer.push(&f);
        drop(framer.next_frame().unwrap());
        let allocated = framer.capacity();
        for _ in 0..1000 {
            framer.push(&f);
            let got = framer.next_frame().unwrap().expect("a whole frame");
            assert_eq!(got.len(), f.len());
        }
        assert_eq!(framer.capacity(), allocated);
    }

    #[test]
    fn a_held_frame_does_not_make_the_buffer_grow() {
        let mut framer = Framer::new(1 << 20, 1 << 20);
        let f = frame(3000, 1);
        framer.push(&f);
        framer.push(&f);
        let allocated = framer.capacity();
        let mut held = Vec::new();
        for _ in 0..100 {
            held.push(framer.next_frame().unwrap().expect("a whole frame"));
            framer.push(&f);
            assert_eq!(framer.capacity(), allocated, "grew for a held frame");
        }
    }

    #[test]
    fn frames_read_straight_from_a_socket_come_out_whole_under_the_bound() {
        use std::io::Write;
        use std::os::fd::AsFd;
        let (mut tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        let bound = 48 * 1024;
        let mut framer = Framer::new(bound, bound);
        let sent: Vec<Vec<u8>> = (0..300)
            .map(|k| frame(16 + (k * 131) % 9000, k as u8))
            .collect();
        let writer = {
            let sent = sent.clone();
            std::thread::spawn(move || sent.iter().for_each(|f| tx.write_all(f).unwrap()))
        };
        let mut got = Vec::new();
        while got.len() < sent.len() {
            while let Some(f) = framer.next_frame().unwrap() {
                got.push(f);
            }
            if got.len() == sent.len() {
                break;
            }
            // Odd read sizes, so frames and reads never line up.
            assert!(framer.read_from(rx.as_fd(), 7919).unwrap() > 0, "early end");
            assert!(framer.capacity() <= bound);
        }
        writer.join().unwrap();
        assert!(got.iter().zip(&sent).all(|(g, s)| g[..] == s[..]));
    }

    #[test]
    fn a_light_stream_keeps_a_small_buffer() {
        use std::io::Write;
        use std::os::fd::AsFd;
        let (mut tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut framer = Framer::new(16 << 20, 16 << 20);
        for k in 0..1000u32 {
            let f = frame(100, k as u8);
            tx.write_all(&f).unwrap();
            // Asked for 64 KiB, as the loop asks: the buffer grows with
            // what comes, not with what was asked.
            assert_eq!(framer.read_from(rx.as_fd(), 64 << 10).unwrap(), f.len());
            assert_eq!(&framer.next_frame().unwrap().expect("whole")[..], &f[..]);
        }
        assert!(framer.capacity() <= 8192, "{} bytes", framer.capacity());
    }

    #[test]
    fn with_no_room_a_read_takes_nothing() {
        use std::io::Write;
        use std::os::fd::AsFd;
        let (mut tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut framer = Framer::new(4096, 4096);
        let f = frame(4096 - LEN_BYTES, 3);
        tx.write_all(&f).unwrap();
        tx.write_all(b"more").unwrap();
        let mut got = 0;
        while got < f.len() {
            got += framer.read_from(rx.as_fd(), 64 << 10).unwrap();
        }
        assert_eq!(framer.room(), 0);
        let e = framer.read_from(rx.as_fd(), 64 << 10).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(&framer.next_frame().unwrap().expect("whole")[..], &f[..]);
        assert_eq!(
            framer.read_from(rx.as_fd(), 64 << 10).unwrap(),
            4,
            "still in the socket"
        );
    }
}
