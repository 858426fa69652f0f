//! The io_uring backend. A request's operations are pushed as one chain
//! linked with IOSQE_IO_LINK: the kernel runs them in order and cancels the
//! rest of the chain when one fails or a write comes up short.

use super::{AlignedBuf, IoBackend, IoCompletion, IoOp, IoRequest};
use io_uring::{opcode, squeue, types, IoUring};
use std::collections::HashMap;
use std::io;

struct Pending {
    token: u64,
    bufs: Vec<AlignedBuf>,
    /// Expected result per op: bytes for writes and reads, 0 for syncs.
    expected: Vec<i32>,
    outstanding: usize,
    error: Option<io::Error>,
}

/// io_uring with one ring per owner thread.
pub struct UringBackend {
    ring: IoUring,
    pending: HashMap<u64, Pending>,
    next_slot: u64,
}

/// Turns a ring setup error into advice for the operator.
pub fn explain_setup_error(e: io::Error) -> io::Error {
    let hint = match e.raw_os_error() {
        Some(libc::EPERM) => {
            "io_uring is refused: check `sysctl kernel.io_uring_disabled` (must be 0, or 1 with the \
             process in the io_uring group) and the seccomp profile (Docker's default blocks io_uring)"
        }
        Some(libc::ENOSYS) => "the kernel has no io_uring (Linux 5.6 or newer is needed)",
        Some(libc::ENOMEM) => "io_uring ring memory could not be locked: raise the memlock limit (LimitMEMLOCK)",
        _ => "io_uring could not be set up",
    };
    io::Error::new(e.kind(), format!("{hint}: {e}"))
}

impl UringBackend {
    /// A ring with room for `queue_depth` submissions.
    pub fn new(queue_depth: u32) -> io::Result<Self> {
        let ring = IoUring::new(queue_depth.next_power_of_two().max(8))?;
        Ok(UringBackend {
            ring,
            pending: HashMap::new(),
            next_slot: 0,
        })
    }

    fn push(&mut self, entry: squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: every buffer an entry points to is owned by a Pending
            // in `self.pending` until its completion is reaped.
            let pushed = unsafe { self.ring.submission().push(&entry).is_ok() };
            if pushed {
                return Ok(());
            }
            self.ring.submit()?; // the queue is full: hand it to the kernel
        }
    }

    fn collect(&mut self, out: &mut Vec<IoCompletion>) {
        let cqes: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (user_data, res) in cqes {
            let slot = user_data >> 8;
            let op = (user_data & 0xff) as usize;
            let p = self
                .pending
                .get_mut(&slot)
                .expect("completion for a known request");
            p.outstanding -= 1;
            if p.error.is_none() {
                if res < 0 {
                    p.error = Some(io::Error::from_raw_os_error(-res));
                } else if res != p.expected[op] {
                    p.error = Some(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("short transfer: {res} of {} bytes", p.expected[op]),
                    ));
                }
            }
            if p.outstanding == 0 {
                let p = self.pending.remove(&slot).expect("present");
                out.push(IoCompletion {
                    token: p.token,
                    result: p.error.map_or(Ok(()), Err),
                    bufs: p.bufs,
                });
            }
        }
    }
}

impl IoBackend for UringBackend {
    fn notify_completions(&mut self, fd: std::os::fd::RawFd) -> io::Result<()> {
        self.ring.submitter().register_eventfd(fd)
    }

    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn submit(&mut self, req: IoRequest) -> io::Result<()> {
        assert!(!req.ops.is_empty() && req.ops.len() < 256);
        self.next_slot += 1;
        let slot = self.next_slot;
        let n = req.ops.len();
        let mut p = Pending {
            token: req.token,
            bufs: Vec::new(),
            expected: Vec::with_capacity(n),
            outstanding: n,
            error: None,
        };
        let mut entries = Vec::with_capacity(n);
        for (i, op) in req.ops.into_iter().enumerate() {
            let user_data = (slot << 8) | i as u64;
            let e = match op {
                IoOp::Write { fd, offset, buf } => {
                    let len = u32::try_from(buf.len()).expect("writes below 4 GiB");
                    p.expected.push(len as i32);
                    let e = opcode::Write::new(types::Fd(fd), buf.as_ptr(), len)
                        .offset(offset)
                        .build();
                    p.bufs.push(buf);
                    e
                }
                IoOp::Fdatasync { fd } => {
                    p.expected.push(0);
                    opcode::Fsync::new(types::Fd(fd))
                        .flags(types::FsyncFlags::DATASYNC)
                        .build()
                }
                IoOp::Read { fd, offset, len } => {
                    let mut buf = AlignedBuf::zeroed(len);
                    p.expected.push(len as i32);
                    let e = opcode::Read::new(types::Fd(fd), buf.as_mut_ptr(), len as u32)
                        .offset(offset)
                        .build();
                    p.bufs.push(buf);
                    e
                }
            };
            let flags = if i + 1 < n {
                squeue::Flags::IO_LINK
            } else {
                squeue::Flags::empty()
            };
            entries.push(e.flags(flags).user_data(user_data));
        }
        // Buffers moved into `p` keep their heap addresses: register first.
        self.pending.insert(slot, p);
        for e in entries {
            self.push(e)?;
        }
        self.ring.submit()?;
        Ok(())
    }

    fn reap(&mut self, wait: bool, out: &mut Vec<IoCompletion>) -> io::Result<()> {
        let before = out.len();
        self.collect(out);
        while wait && out.len() == before && !self.pending.is_empty() {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            self.collect(out);
        }
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.pending.len()
    }
}

impl Drop for UringBackend {
    fn drop(&mut self) {
        // The kernel may still write into buffers we own: wait them out.
        let mut sink = Vec::new();
        while !self.pending.is_empty() {
            if self.reap(true, &mut sink).is_err() {
                break;
            }
            sink.clear();
        }
    }
}
