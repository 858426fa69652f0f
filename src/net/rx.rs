//! Receiving with `recvmmsg`, splitting GRO messages back into
//! datagrams, and putting the messages of several sockets back in the
//! order they arrived.
//!
//! With `UDP_GRO` on, the kernel may hand up several datagrams of one
//! flow as one message and says, in a `UDP_GRO` control message, the size
//! of each (the *stride*; the last may be shorter). Every buffer is
//! therefore 64 KiB, the largest such message.
//!
//! A channel's frames can ride in datagrams of other groups (the core
//! packs small frames of every group going to a peer together), so they
//! reach this thread on several sockets. Reading one socket's batch and
//! then the next would reorder them by up to a whole batch, longer than
//! the receiver's NACK delay, and cause needless retransmission
//! requests. So a driver with several sockets asks for kernel receive
//! timestamps (SO_TIMESTAMPNS), reads a share of the batch from each
//! ready socket, and hands the messages on in timestamp order.

use super::socket::RawAddr;
use super::stats::NetStats;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::RawFd;

/// Bytes of one receive buffer: the largest UDP payload, rounded up.
pub(crate) const RX_BUF_BYTES: usize = 1 << 16;

/// Control-message space per message: a `UDP_GRO` int and an
/// `SCM_TIMESTAMPNS` timespec, 8-byte aligned, with room to spare.
type CmsgBuf = [u64; 12];

/// One received message: how long, its GRO stride, when and from where.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Received {
    pub(crate) len: usize,
    /// Size of each datagram in it; equal to `len` without GRO.
    pub(crate) stride: usize,
    /// Kernel receive time in ns (wall clock), 0 if not asked for.
    pub(crate) stamp_ns: u64,
    /// Where it came from, for diagnostics.
    pub(crate) from: Option<SocketAddr>,
}

/// Message slots for `recvmmsg`, reused across calls and sockets; a call
/// fills a range of them.
pub(crate) struct RxBatch {
    bufs: Vec<u8>,
    cmsgs: Vec<CmsgBuf>,
    names: Vec<RawAddr>,
    got: Vec<Received>,
}

impl RxBatch {
    /// Room for `n` messages.
    pub(crate) fn new(n: usize) -> Self {
        RxBatch {
            bufs: vec![0; n * RX_BUF_BYTES],
            cmsgs: vec![[0; 12]; n],
            names: vec![RawAddr::empty(); n],
            got: vec![Received::default(); n],
        }
    }

    /// Message slots.
    pub(crate) fn capacity(&self) -> usize {
        self.cmsgs.len()
    }

    /// Receives what is queued on `fd` into `slots`, without waiting.
    /// Returns the number of messages (in slots `slots.start..`); 0 when
    /// none was queued.
    pub(crate) fn recv(
        &mut self,
        fd: RawFd,
        slots: Range<usize>,
        stats: &mut NetStats,
    ) -> io::Result<usize> {
        assert!(slots.end <= self.capacity() && !slots.is_empty());
        let n = slots.len();
        let bufs = &mut self.bufs[slots.start * RX_BUF_BYTES..slots.end * RX_BUF_BYTES];
        let mut iovs: Vec<libc::iovec> = Vec::with_capacity(n);
        for chunk in bufs.chunks_exact_mut(RX_BUF_BYTES) {
            iovs.push(libc::iovec {
                iov_base: chunk.as_mut_ptr() as *mut libc::c_void,
                iov_len: RX_BUF_BYTES,
            });
        }
        let mut msgs: Vec<libc::mmsghdr> = Vec::with_capacity(n);
        let each = iovs
            .iter_mut()
            .zip(&mut self.names[slots.clone()])
            .zip(&mut self.cmsgs[slots.clone()]);
        for ((iov, name), cmsg) in each {
            // SAFETY: mmsghdr is plain data; all-zero is valid.
            let mut m: libc::mmsghdr = unsafe { zeroed() };
            m.msg_hdr.msg_name = &mut name.storage as *mut _ as *mut libc::c_void;
            m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as u32;
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
            m.msg_hdr.msg_control = cmsg.as_mut_ptr() as *mut libc::c_void;
            m.msg_hdr.msg_controllen = size_of::<CmsgBuf>();
            msgs.push(m);
        }
        let ret = loop {
            stats.recv_calls += 1;
            // SAFETY: every pointer in msgs points into iovs, self.bufs,
            // self.names or self.cmsgs, all alive and unmoved until the
            // call returns.
            let r = unsafe {
                libc::recvmmsg(
                    fd,
                    msgs.as_mut_ptr(),
                    n as u32,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if r >= 0 {
                break r as usize;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Ok(0),
                _ => return Err(e),
            }
        };
        for (k, m) in msgs[..ret].iter().enumerate() {
            let slot = slots.start + k;
            let len = m.msg_len as usize;
            let mut name = self.names[slot];
            name.len = m.msg_hdr.msg_namelen;
            let from = name.to_std();
            let (gro, stamp_ns) = control(&m.msg_hdr);
            if m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                // Larger than 64 KiB cannot be UDP; count it and move on.
                stats.recv_truncated += 1;
                self.got[slot] = Received {
                    len: 0,
                    stride: 0,
                    stamp_ns,
                    from,
                };
                continue;
            }
            let stride = gro.unwrap_or(len);
            if stride > 0 && stride < len {
                stats.gro_receives += 1;
            }
            self.got[slot] = Received {
                len,
                stride,
                stamp_ns,
                from,
            };
        }
        Ok(ret)
    }

    /// The message in `slot` from the last `recv` that filled it.
    pub(crate) fn message(&self, slot: usize) -> Received {
        self.got[slot]
    }

    /// Calls `f` with the offset and length of every datagram of the
    /// message in `slot` (for [`RxBatch::bytes`]).
    pub(crate) fn datagram_ranges(&self, slot: usize, mut f: impl FnMut(usize, usize)) {
        let r = self.got[slot];
        if r.len == 0 || r.stride == 0 {
            return;
        }
        let mut off = 0;
        while off < r.len {
            let len = r.stride.min(r.len - off);
            f(off, len);
            off += len;
        }
    }

    /// The bytes of a datagram of the message in `slot`, at `off..off +
    /// len` within it.
    pub(crate) fn bytes(&self, slot: usize, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.got[slot].len);
        &self.bufs[slot * RX_BUF_BYTES + off..slot * RX_BUF_BYTES + off + len]
    }
}

/// The `UDP_GRO` segment size and the `SCM_TIMESTAMPNS` time (ns) the
/// kernel attached to a message, where present.
fn control(hdr: &libc::msghdr) -> (Option<usize>, u64) {
    let (mut gro, mut stamp_ns) = (None, 0);
    // SAFETY: the kernel filled msg_control up to msg_controllen with
    // well-formed control messages; the CMSG macros stay inside it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            let (level, kind) = ((*c).cmsg_level, (*c).cmsg_type);
            if level == libc::SOL_UDP && kind == libc::UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                gro = usize::try_from(v).ok().filter(|&s| s > 0);
            } else if level == libc::SOL_SOCKET && kind == libc::SCM_TIMESTAMPNS {
                let t = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                stamp_ns = (t.tv_sec as u64)
                    .saturating_mul(1_000_000_000)
                    .saturating_add(t.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
    }
    (gro, stamp_ns)
}
