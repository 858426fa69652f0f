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
    /// The kernel skips the completions of a chain's ops that succeed
    /// but the last (IOSQE_CQE_SKIP_SUCCESS, Linux 5.17): one completion,
    /// and so one wake-up of the loop, per request.
    skip_success: bool,
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
        let skip_success = ring.params().is_feature_skip_cqe_on_success();
        Ok(UringBackend {
            ring,
            pending: HashMap::new(),
            next_slot: 0,
            skip_success,
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
            // With skipped completions a request ends at its first
            // completion (a failed op's: the kernel then skips those of
            // the ops it cancels); a kernel that posted those anyway
            // posts them for a request already ended.
            let Some(p) = self.pending.get_mut(&slot) else {
                assert!(self.skip_success, "completion for an unknown request");
                continue;
            };
            let whole = res == p.expected[op];
            // A request is durable only once its last op completed: an
            // op's success that was not skipped ends nothing early.
            if self.skip_success && whole && op + 1 < p.expected.len() {
                continue;
            }
            p.outstanding -= 1;
            if p.error.is_none() {
                if res < 0 {
                    p.error = Some(io::Error::from_raw_os_error(-res));
                } else if !whole {
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
        // The write is issued inline, not handed whole to an io_uring
        // worker (IOSQE_ASYNC): that spared the loop one wake-up per
        // flush, but the worker's wake-up delayed every write, and the
        // WAL alone lost 10-25% of its throughput (bench/README.md,
        // "Light load").
        let mut p = Pending {
            token: req.token,
            bufs: Vec::new(),
            expected: Vec::with_capacity(n),
            outstanding: if self.skip_success { 1 } else { n },
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
            let mut flags = squeue::Flags::empty();
            if i + 1 < n {
                flags |= squeue::Flags::IO_LINK;
                // Safe with the ring's default setup: with
                // IORING_SETUP_DEFER_TASKRUN, skipped completions in
                // linked chains hang on kernels 6.1-6.11 (liburing#1235).
                if self.skip_success {
                    flags |= squeue::Flags::SKIP_SUCCESS;
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, RawFd};

    fn write_then_sync(fd: RawFd, token: u64, bytes: &[u8]) -> IoRequest {
        IoRequest {
            token,
            ops: vec![
                IoOp::Write {
                    fd,
                    offset: 0,
                    buf: AlignedBuf::from_slice(bytes),
                },
                IoOp::Fdatasync { fd },
            ],
        }
    }

    fn reap_one(b: &mut UringBackend) -> IoCompletion {
        let mut out = Vec::new();
        b.reap(true, &mut out).unwrap();
        assert_eq!(out.len(), 1, "one completion per request");
        out.pop().unwrap()
    }

    /// A write and its fdatasync end as one request, whether the chain
    /// succeeds or its write fails (the fdatasync then never runs), and
    /// no completion of a cancelled op turns up afterwards.
    #[test]
    fn a_chain_ends_once_whether_it_succeeds_or_its_write_fails() {
        let Ok(mut b) = UringBackend::new(8) else {
            eprintln!("io_uring unavailable here: nothing to test");
            return;
        };
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("f");
        let rw = std::fs::File::create(&path).unwrap();
        b.submit(write_then_sync(rw.as_raw_fd(), 1, b"hello"))
            .unwrap();
        let c = reap_one(&mut b);
        assert_eq!(c.token, 1);
        assert!(c.result.is_ok(), "{:?}", c.result);
        assert_eq!(std::fs::read(&path).unwrap(), b"hello");

        // A read-only descriptor: the write fails, the chain is cut.
        let ro = std::fs::File::open(&path).unwrap();
        b.submit(write_then_sync(ro.as_raw_fd(), 2, b"xx")).unwrap();
        let c = reap_one(&mut b);
        assert_eq!(c.token, 2);
        assert!(c.result.is_err(), "the failed write is reported");
        assert_eq!(b.in_flight(), 0);

        // The ring goes on, and hands over nothing stale.
        b.submit(write_then_sync(rw.as_raw_fd(), 3, b"again"))
            .unwrap();
        let c = reap_one(&mut b);
        assert_eq!(c.token, 3);
        assert!(c.result.is_ok());
        let mut out = Vec::new();
        b.reap(false, &mut out).unwrap();
        assert!(out.is_empty(), "no completion left over");
    }
}
