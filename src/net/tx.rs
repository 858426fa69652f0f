//! The send queue of one socket and its `sendmmsg` flush, with UDP GSO.
//!
//! Datagrams are appended into one buffer as *runs*: consecutive
//! datagrams to the same destination, all of one size except a shorter
//! last one. With GSO a run goes to the kernel as one message carrying a
//! `UDP_SEGMENT` control message (the segment size), and the kernel (or
//! the NIC) cuts it into datagrams; without GSO every run is one datagram.
//! One `sendmmsg` then hands over many runs.
//!
//! GSO degrades at run time, as quinn-udp does: if the kernel refuses a
//! segmented message with EIO (the egress device cannot checksum or
//! segment UDP: some virtual NICs, or offloads turned off with ethtool)
//! or EINVAL (segment size above the path MTU, a kernel with a lower
//! segment limit), the queue is re-cut into single datagrams, sent again,
//! and GSO stays off for the driver with that reason recorded.

use super::config::UDP_PAYLOAD_BYTES_MAX;
use super::socket::RawAddr;
use super::stats::NetStats;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::RawFd;

/// Messages per `sendmmsg` call (the kernel's UIO_MAXIOV).
const SENDMMSG_MAX: usize = 1024;

/// Control-message space for one `UDP_SEGMENT` (a u16), 8-byte aligned.
type CmsgBuf = [u64; 4];

/// Consecutive datagrams to one destination: `segments` of `seg_bytes`,
/// the last possibly shorter, stored at `buf[start..start + len]`.
#[derive(Clone, Copy, Debug)]
struct Run {
    dest: SocketAddr,
    start: usize,
    len: usize,
    seg_bytes: usize,
    segments: usize,
    /// A shorter datagram ended it: nothing more can join.
    closed: bool,
}

/// What a flush left behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flushed {
    /// Everything queued went to the kernel (or was dropped by an error).
    All,
    /// The socket buffer is full (EAGAIN): wait for POLLOUT.
    Blocked,
}

/// GSO state shared by every socket of a driver.
#[derive(Clone, Debug)]
pub(crate) struct Gso {
    /// Segments per message; 1 means GSO is off.
    pub(crate) segments_max: usize,
    /// Why GSO is off, if it is.
    pub(crate) off_reason: Option<String>,
}

/// The datagrams waiting for one socket.
#[derive(Default)]
pub(crate) struct TxQueue {
    buf: Vec<u8>,
    runs: Vec<Run>,
    /// Runs before this were handed to the kernel.
    head: usize,
    /// Datagrams queued and not yet handed over.
    datagrams: usize,
}

impl TxQueue {
    /// Datagrams waiting.
    pub(crate) fn datagrams(&self) -> usize {
        self.datagrams
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.head == self.runs.len()
    }

    /// Appends a datagram, joining the last run where GSO allows.
    pub(crate) fn push(&mut self, dest: SocketAddr, datagram: &[u8], gso_segments_max: usize) {
        debug_assert!(!datagram.is_empty() && datagram.len() <= UDP_PAYLOAD_BYTES_MAX);
        let start = self.buf.len();
        self.buf.extend_from_slice(datagram);
        self.add_run(dest, start, datagram.len(), gso_segments_max);
    }

    /// Takes a whole batch of datagrams laid end to end in `batch`, to
    /// `dests` with their sizes, as `push` of each would, but by swapping
    /// buffers when nothing is waiting (the usual case): the batch is not
    /// copied. `batch` gets a cleared buffer back, with its capacity.
    pub(crate) fn push_batch(
        &mut self,
        batch: &mut Vec<u8>,
        dests: &[(SocketAddr, usize)],
        gso_segments_max: usize,
    ) {
        debug_assert_eq!(dests.iter().map(|d| d.1).sum::<usize>(), batch.len());
        if !self.is_empty() {
            let mut at = 0;
            for &(dest, n) in dests {
                self.push(dest, &batch[at..at + n], gso_segments_max);
                at += n;
            }
            batch.clear();
            return;
        }
        self.buf.clear();
        std::mem::swap(&mut self.buf, batch);
        let mut at = 0;
        for &(dest, n) in dests {
            debug_assert!(n > 0 && n <= UDP_PAYLOAD_BYTES_MAX);
            self.add_run(dest, at, n, gso_segments_max);
            at += n;
        }
    }

    /// Counts the datagram of `n` bytes at `buf[start..]`, joining the
    /// last run where GSO allows.
    fn add_run(&mut self, dest: SocketAddr, start: usize, n: usize, gso_segments_max: usize) {
        self.datagrams += 1;
        if self.runs.len() > self.head {
            let last = self.runs.last_mut().expect("non-empty");
            if !last.closed
                && last.dest == dest
                && n <= last.seg_bytes
                && last.segments < gso_segments_max
                && last.len + n <= UDP_PAYLOAD_BYTES_MAX
            {
                debug_assert_eq!(last.start + last.len, start);
                last.len += n;
                last.segments += 1;
                last.closed = n < last.seg_bytes;
                return;
            }
        }
        self.runs.push(Run {
            dest,
            start,
            len: n,
            seg_bytes: n,
            segments: 1,
            closed: false,
        });
    }

    /// Re-cuts every waiting run into single datagrams (GSO went off).
    fn split_runs(&mut self) {
        let mut out = Vec::with_capacity(self.datagrams);
        for r in &self.runs[self.head..] {
            let mut off = r.start;
            let end = r.start + r.len;
            while off < end {
                let len = r.seg_bytes.min(end - off);
                out.push(Run {
                    dest: r.dest,
                    start: off,
                    len,
                    seg_bytes: len,
                    segments: 1,
                    closed: true,
                });
                off += len;
            }
        }
        self.runs.truncate(self.head);
        self.runs.extend(out);
    }

    fn consumed(&mut self, k: usize) {
        for r in &self.runs[self.head..self.head + k] {
            self.datagrams -= r.segments;
        }
        self.head += k;
        if self.head == self.runs.len() {
            self.buf.clear();
            self.runs.clear();
            self.head = 0;
        }
    }

    /// Hands each waiting datagram to `send` (the AF_XDP path), in order,
    /// until it returns false (no room: the rest waits) or none is left.
    pub(crate) fn drain_each(
        &mut self,
        mut send: impl FnMut(SocketAddr, &[u8]) -> bool,
    ) -> Flushed {
        if self.runs[self.head..].iter().any(|r| r.segments > 1) {
            self.split_runs();
        }
        while !self.is_empty() {
            let r = self.runs[self.head];
            if !send(r.dest, &self.buf[r.start..r.start + r.len]) {
                return Flushed::Blocked;
            }
            self.consumed(1);
        }
        Flushed::All
    }

    /// Hands every waiting run to the kernel with `sendmmsg`, until done or
    /// the socket would block. Errors other than EAGAIN drop the message
    /// they belong to (the protocol retransmits), counted in `stats` and
    /// described in `notices`.
    pub(crate) fn flush(
        &mut self,
        fd: RawFd,
        gso: &mut Gso,
        stats: &mut NetStats,
        notices: &mut Vec<String>,
    ) -> Flushed {
        let mut names: Vec<RawAddr> = Vec::new();
        let mut iovs: Vec<libc::iovec> = Vec::new();
        let mut cmsgs: Vec<CmsgBuf> = Vec::new();
        let mut msgs: Vec<libc::mmsghdr> = Vec::new();
        while !self.is_empty() {
            let batch = &self.runs[self.head..(self.head + SENDMMSG_MAX).min(self.runs.len())];
            names.clear();
            iovs.clear();
            cmsgs.clear();
            msgs.clear();
            for r in batch {
                names.push(RawAddr::from_std(&r.dest));
                iovs.push(libc::iovec {
                    iov_base: self.buf[r.start..].as_ptr() as *mut libc::c_void,
                    iov_len: r.len,
                });
                cmsgs.push([0; 4]);
            }
            for (i, r) in batch.iter().enumerate() {
                // SAFETY: mmsghdr is plain data; all-zero is valid.
                let mut m: libc::mmsghdr = unsafe { zeroed() };
                m.msg_hdr.msg_name = &mut names[i].storage as *mut _ as *mut libc::c_void;
                m.msg_hdr.msg_namelen = names[i].len;
                m.msg_hdr.msg_iov = &mut iovs[i];
                m.msg_hdr.msg_iovlen = 1;
                if r.segments > 1 {
                    let space = cmsg_udp_segment(&mut cmsgs[i], r.seg_bytes as u16);
                    m.msg_hdr.msg_control = cmsgs[i].as_mut_ptr() as *mut libc::c_void;
                    m.msg_hdr.msg_controllen = space;
                }
                msgs.push(m);
            }
            stats.send_calls += 1;
            // SAFETY: every pointer in msgs points into names, iovs, cmsgs
            // or self.buf, all alive and unmoved until the call returns.
            let ret = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), msgs.len() as u32, 0) };
            if ret >= 0 {
                let k = ret as usize;
                for r in &batch[..k] {
                    stats.datagrams_sent += r.segments as u64;
                    stats.bytes_sent += r.len as u64;
                    if r.segments > 1 {
                        stats.gso_sends += 1;
                    }
                }
                self.consumed(k);
                continue;
            }
            let e = io::Error::last_os_error();
            let first = batch[0];
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => {
                    stats.send_would_block += 1;
                    return Flushed::Blocked;
                }
                Some(code @ (libc::EIO | libc::EINVAL)) if first.segments > 1 => {
                    let why = if code == libc::EIO {
                        "the egress device cannot segment or checksum UDP (check `ethtool -k` \
                         tx-udp-segmentation / tx-checksumming)"
                    } else {
                        "the kernel refused the segment size or count"
                    };
                    let reason = format!(
                        "GSO turned off: sendmmsg with UDP_SEGMENT ({} segments of {} bytes to \
                         {}) failed: {e}: {why}; sending one datagram per message from now on",
                        first.segments, first.seg_bytes, first.dest
                    );
                    notices.push(reason.clone());
                    gso.segments_max = 1;
                    gso.off_reason = Some(reason);
                    stats.gso_fallbacks += 1;
                    self.split_runs();
                }
                _ => {
                    stats.send_errors += first.segments as u64;
                    if stats.send_errors_noticed < SEND_ERRORS_NOTICED_MAX {
                        stats.send_errors_noticed += 1;
                        notices.push(format!(
                            "send of {} bytes to {} failed, dropped (retransmission recovers): {e}{}",
                            first.len,
                            first.dest,
                            hint_for(e.raw_os_error())
                        ));
                    }
                    self.consumed(1);
                }
            }
        }
        Flushed::All
    }
}

/// Send errors described in notices; later ones are only counted.
const SEND_ERRORS_NOTICED_MAX: u64 = 16;

fn hint_for(code: Option<i32>) -> &'static str {
    match code {
        Some(libc::EPERM) => {
            " (a firewall rule on the output path drops it: check nftables/iptables)"
        }
        Some(libc::ENETUNREACH | libc::EHOSTUNREACH) => " (no route to the peer)",
        Some(libc::EMSGSIZE) => " (larger than the device MTU: lower mtu_bytes)",
        Some(libc::ENOBUFS) => " (the device queue is full)",
        _ => "",
    }
}

/// Writes a `UDP_SEGMENT` control message into `buf`; returns its space.
fn cmsg_udp_segment(buf: &mut CmsgBuf, seg_bytes: u16) -> usize {
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
    assert!(space <= size_of::<CmsgBuf>());
    // SAFETY: a msghdr describing `buf` lets the CMSG macros find its first
    // header inside `buf`, which is large and aligned enough (asserted).
    unsafe {
        let mut hdr: libc::msghdr = zeroed();
        hdr.msg_control = buf.as_mut_ptr() as *mut libc::c_void;
        hdr.msg_controllen = space;
        let c = libc::CMSG_FIRSTHDR(&hdr);
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = libc::UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, seg_bytes);
    }
    space
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    #[test]
    fn runs_join_same_size_datagrams_to_one_destination() {
        let mut q = TxQueue::default();
        for _ in 0..3 {
            q.push(a(1), &[1; 100], 64);
        }
        q.push(a(1), &[2; 50], 64); // shorter: joins, closes
        q.push(a(1), &[3; 50], 64); // after a short one: new run
        q.push(a(2), &[4; 50], 64); // other destination: new run
        q.push(a(2), &[5; 60], 64); // larger: new run
        assert_eq!(q.datagrams(), 7);
        let shape: Vec<_> = q.runs.iter().map(|r| (r.segments, r.len)).collect();
        assert_eq!(shape, vec![(4, 350), (1, 50), (1, 50), (1, 60)]);
        q.split_runs();
        assert_eq!(q.runs.len(), 7);
        assert!(q.runs.iter().all(|r| r.segments == 1));
        assert_eq!(q.runs[3].len, 50);
    }

    #[test]
    fn a_batch_is_taken_as_pushing_each_would_and_not_copied_into_an_empty_queue() {
        let datagrams: Vec<(SocketAddr, Vec<u8>)> = vec![
            (a(1), vec![1; 100]),
            (a(1), vec![2; 100]),
            (a(1), vec![3; 40]),
            (a(2), vec![4; 70]),
        ];
        let mut batch: Vec<u8> = datagrams.iter().flat_map(|d| d.1.clone()).collect();
        let dests: Vec<(SocketAddr, usize)> = datagrams.iter().map(|d| (d.0, d.1.len())).collect();
        let mut each = TxQueue::default();
        for (dest, d) in &datagrams {
            each.push(*dest, d, 64);
        }
        let shape = |q: &TxQueue| -> Vec<_> {
            q.runs
                .iter()
                .map(|r| (r.dest, r.start, r.len, r.segments, r.closed))
                .collect()
        };
        // Into an empty queue: the batch's own buffer, swapped in.
        let mut whole = TxQueue::default();
        let at = batch.as_ptr();
        whole.push_batch(&mut batch, &dests, 64);
        assert_eq!(whole.buf.as_ptr(), at, "not copied");
        assert!(batch.is_empty());
        assert_eq!(
            (shape(&whole), whole.datagrams()),
            (shape(&each), each.datagrams())
        );
        assert_eq!(whole.buf, each.buf);
        // Behind datagrams still waiting: appended, as pushes would.
        let mut batch2: Vec<u8> = datagrams.iter().flat_map(|d| d.1.clone()).collect();
        whole.push_batch(&mut batch2, &dests, 64);
        for (dest, d) in &datagrams {
            each.push(*dest, d, 64);
        }
        assert_eq!(
            (shape(&whole), whole.datagrams()),
            (shape(&each), each.datagrams())
        );
        assert_eq!(whole.buf, each.buf);
    }

    #[test]
    fn runs_respect_segment_and_byte_limits() {
        let mut q = TxQueue::default();
        for _ in 0..10 {
            q.push(a(1), &[0; 100], 4);
        }
        let shape: Vec<_> = q.runs.iter().map(|r| r.segments).collect();
        assert_eq!(shape, vec![4, 4, 2]);
        let mut q = TxQueue::default();
        for _ in 0..50 {
            q.push(a(1), &[0; 1452], 64);
        }
        assert!(q.runs.iter().all(|r| r.len <= UDP_PAYLOAD_BYTES_MAX));
        assert_eq!(q.runs[0].segments, UDP_PAYLOAD_BYTES_MAX / 1452);
        let mut q = TxQueue::default();
        q.push(a(1), &[0; 100], 1);
        q.push(a(1), &[0; 100], 1);
        assert_eq!(q.runs.len(), 2, "GSO off: one datagram per run");
    }
}
