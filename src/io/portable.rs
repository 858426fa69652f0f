//! The portable backend: the same requests run with pwrite, pread and
//! fdatasync on a helper thread, so the owner thread keeps accumulating the
//! next batch while a flush is in progress, as with io_uring.

use super::{AlignedBuf, IoBackend, IoCompletion, IoOp, IoRequest};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::io;
use std::os::fd::RawFd;
use std::thread::JoinHandle;

/// pwrite + fdatasync on one helper thread.
pub struct PortableBackend {
    /// The eventfd the helper signals after each completion (-1: none).
    notify: std::sync::Arc<std::sync::atomic::AtomicI32>,
    to_worker: Option<Sender<IoRequest>>,
    from_worker: Receiver<IoCompletion>,
    worker: Option<JoinHandle<()>>,
    in_flight: usize,
}

fn check(ret: isize, expected: usize) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else if ret as usize != expected {
        Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("short transfer: {ret} of {expected} bytes"),
        ))
    } else {
        Ok(())
    }
}

fn run_op(op: IoOp, bufs: &mut Vec<AlignedBuf>) -> io::Result<()> {
    match op {
        IoOp::Write { fd, offset, buf } => {
            // SAFETY: buf is valid for buf.len() bytes; fd is owned by the
            // caller and outlives the request.
            let ret =
                unsafe { libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), offset as libc::off_t) };
            let len = buf.len();
            bufs.push(buf);
            check(ret, len)
        }
        IoOp::Fdatasync { fd } => sync(fd),
        IoOp::Read { fd, offset, len } => {
            let mut buf = AlignedBuf::zeroed(len);
            // SAFETY: buf is valid for `len` writable bytes.
            let ret =
                unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), len, offset as libc::off_t) };
            bufs.push(buf);
            check(ret, len)
        }
    }
}

fn sync(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain syscall on a descriptor the caller keeps open.
    if unsafe { libc::fdatasync(fd) } != 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl PortableBackend {
    /// Starts the helper thread.
    pub fn new() -> io::Result<Self> {
        let (to_worker, requests) = unbounded::<IoRequest>();
        let (done, from_worker) = unbounded();
        let notify = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(-1));
        let notify_fd = std::sync::Arc::clone(&notify);
        let worker = std::thread::Builder::new()
            .name("quire-io".into())
            .spawn(move || {
                for req in requests {
                    let mut bufs = Vec::new();
                    let mut result = Ok(());
                    for op in req.ops {
                        if result.is_ok() {
                            result = run_op(op, &mut bufs);
                        } else if let IoOp::Write { buf, .. } = op {
                            bufs.push(buf); // not run after a failure
                        }
                    }
                    let c = IoCompletion {
                        token: req.token,
                        result,
                        bufs,
                    };
                    if done.send(c).is_err() {
                        return;
                    }
                    let fd = notify_fd.load(std::sync::atomic::Ordering::Acquire);
                    if fd >= 0 {
                        let one = 1u64.to_ne_bytes();
                        // SAFETY: writes 8 bytes from a live buffer to an
                        // eventfd the owner keeps open while we run.
                        unsafe { libc::write(fd, one.as_ptr().cast(), 8) };
                    }
                }
            })?;
        Ok(PortableBackend {
            notify,
            to_worker: Some(to_worker),
            from_worker,
            worker: Some(worker),
            in_flight: 0,
        })
    }
}

impl IoBackend for PortableBackend {
    fn name(&self) -> &'static str {
        "portable"
    }

    fn notify_completions(&mut self, fd: std::os::fd::RawFd) -> io::Result<()> {
        self.notify.store(fd, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    fn submit(&mut self, req: IoRequest) -> io::Result<()> {
        let tx = self.to_worker.as_ref().expect("worker runs until drop");
        tx.send(req)
            .map_err(|_| io::Error::other("the I/O helper thread has stopped"))?;
        self.in_flight += 1;
        Ok(())
    }

    fn reap(&mut self, wait: bool, out: &mut Vec<IoCompletion>) -> io::Result<()> {
        if wait && self.in_flight > 0 {
            let c = self
                .from_worker
                .recv()
                .map_err(|_| io::Error::other("the I/O helper thread has stopped"))?;
            self.in_flight -= 1;
            out.push(c);
        }
        while let Ok(c) = self.from_worker.try_recv() {
            self.in_flight -= 1;
            out.push(c);
        }
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl Drop for PortableBackend {
    fn drop(&mut self) {
        self.to_worker.take(); // ends the worker's loop once it drains
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}
