//! A null-modem cable emulated on two pseudo-terminals, for tests and for
//! `quire up`: each end is the slave side of its own PTY, opened by path
//! like a real tty; a forwarding thread copies what one end writes (read
//! from its master) to the other end's master, where the other end reads it.
//!
//! Why two PTYs and a thread rather than one PTY pair (whose master and
//! slave are already a "cable"): a master is not a tty the serial driver
//! could open by path, so one pair would give the two ends different code
//! paths; and with the thread in the middle the cable can be unplugged
//! (bytes dropped both ways), replugged, made noisy (garbage written into
//! one end's line), and either end's device can vanish and reappear like
//! a USB adapter pulled out and plugged back in.
//!
//! Each end is exposed as a symlink (`<dir>/ttyA`, `<dir>/ttyB`) to its
//! `/dev/pts/N`, the way udev exposes `/dev/serial/by-id/...`: when a
//! device vanishes its link goes, and it comes back pointing at a new PTY.
//!
//! Like a real line without flow control, bytes the far end is not
//! reading are lost once its input queue is full (counted in
//! [`CableStats`]). The emulator keeps every slave open itself, so an
//! endpoint may close and reopen its end at will. Baud rate is not
//! emulated: bytes cross as fast as the thread copies them.

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::pty::{grantpt, posix_openpt, ptsname_r, unlockpt};
use nix::sys::termios::{self, SetArg};
use nix::unistd;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// One end of the emulated cable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum End {
    /// The end at `<dir>/ttyA`.
    A,
    /// The end at `<dir>/ttyB`.
    B,
}

impl End {
    fn index(self) -> usize {
        match self {
            End::A => 0,
            End::B => 1,
        }
    }
}

/// Counters of the emulated cable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CableStats {
    /// Bytes carried from A to B and from B to A.
    pub bytes_forwarded: [u64; 2],
    /// Bytes written by an end while the cable was unplugged (lost).
    pub bytes_dropped_unplugged: u64,
    /// Bytes lost because the receiving end's input queue was full, or its
    /// device had vanished.
    pub bytes_dropped_overrun: u64,
    /// Garbage bytes written into an end's line.
    pub garbage_bytes: u64,
}

enum Command {
    Garbage(usize, Vec<u8>),
    Vanish(usize),
    Reappear(usize, Pty),
    Release(usize),
}

struct Shared {
    plugged: AtomicBool,
    stop: AtomicBool,
    commands: Mutex<VecDeque<(Command, mpsc::Sender<()>)>>,
    stats: Mutex<CableStats>,
}

/// One PTY: the master the thread reads and writes, and the slave it keeps
/// open so that the master never reads EIO while the endpoint is closed.
struct Pty {
    master: OwnedFd,
    slave: OwnedFd,
    path: PathBuf,
}

/// The emulated cable; dropping it stops the thread and removes the links.
pub struct NullModem {
    links: [PathBuf; 2],
    shared: Arc<Shared>,
    wake: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl NullModem {
    /// Creates both ends, with their links in `dir` (which must exist),
    /// plugged in.
    pub fn new(dir: &Path) -> io::Result<NullModem> {
        let links = [dir.join("ttyA"), dir.join("ttyB")];
        let ptys = [open_pty()?, open_pty()?];
        for (pty, link) in ptys.iter().zip(&links) {
            relink(&pty.path, link)?;
        }
        let (wake_r, wake_w) = pipe()?;
        let shared = Arc::new(Shared {
            plugged: AtomicBool::new(true),
            stop: AtomicBool::new(false),
            commands: Mutex::new(VecDeque::new()),
            stats: Mutex::new(CableStats::default()),
        });
        let s = shared.clone();
        let [a, b] = ptys;
        let thread = std::thread::Builder::new()
            .name("null-modem".into())
            .spawn(move || forward(s, [Some(a), Some(b)], wake_r))?;
        Ok(NullModem {
            links,
            shared,
            wake: wake_w,
            thread: Some(thread),
        })
    }

    /// The device path an endpoint opens for `end`.
    pub fn path(&self, end: End) -> &Path {
        &self.links[end.index()]
    }

    /// Pulls the cable: from now on bytes written at either end are lost.
    pub fn unplug(&self) {
        self.shared.plugged.store(false, Ordering::SeqCst);
    }

    /// Plugs the cable back in.
    pub fn replug(&self) {
        self.shared.plugged.store(true, Ordering::SeqCst);
    }

    /// True while the cable is plugged in.
    pub fn is_plugged(&self) -> bool {
        self.shared.plugged.load(Ordering::SeqCst)
    }

    /// Writes `bytes` into `end`'s line, as noise the endpoint there reads;
    /// plugged or not. Returns once written (or dropped, if the end's
    /// input queue is full).
    pub fn inject_garbage(&self, end: End, bytes: &[u8]) {
        self.command(Command::Garbage(end.index(), bytes.to_vec()));
    }

    /// `end`'s device vanishes (a USB adapter pulled out): its PTY is
    /// closed, so an endpoint that has it open reads EIO, and its link is
    /// removed, so reopening fails until [`NullModem::reappear`].
    pub fn vanish(&self, end: End) {
        let _ = std::fs::remove_file(&self.links[end.index()]);
        self.command(Command::Vanish(end.index()));
    }

    /// `end`'s device comes back, as a new PTY behind the same link.
    pub fn reappear(&self, end: End) -> io::Result<()> {
        let pty = open_pty()?;
        relink(&pty.path, &self.links[end.index()])?;
        self.command(Command::Reappear(end.index(), pty));
        Ok(())
    }

    /// Clears exclusive mode on `end`'s tty. The serial driver sets it
    /// (TIOCEXCL) when an endpoint opens the port, and the tty forgets it
    /// only on its last close, which never comes here since this emulator
    /// keeps the slave open: without this, an endpoint killed and started
    /// again gets EBUSY unless it runs as root. Call before a restart.
    pub fn release(&self, end: End) {
        self.command(Command::Release(end.index()));
    }

    /// The counters.
    pub fn stats(&self) -> CableStats {
        *self.shared.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands a command to the thread and waits until it has run it.
    fn command(&self, c: Command) {
        let (tx, rx) = mpsc::channel();
        self.shared
            .commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back((c, tx));
        self.wake_thread();
        // The thread answers every command, or has stopped (dropping tx).
        let _ = rx.recv();
    }

    fn wake_thread(&self) {
        // A full pipe already wakes the thread; nothing to do on EAGAIN.
        let _ = unistd::write(&self.wake, &[1u8]);
    }
}

impl Drop for NullModem {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.wake_thread();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for l in &self.links {
            let _ = std::fs::remove_file(l);
        }
    }
}

impl std::fmt::Debug for NullModem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NullModem")
            .field("links", &self.links)
            .field("plugged", &self.is_plugged())
            .finish()
    }
}

/// The forwarding thread: waits on both masters and the wake pipe, copies
/// bytes across when plugged, runs commands.
fn forward(shared: Arc<Shared>, mut ptys: [Option<Pty>; 2], wake: OwnedFd) {
    let mut buf = [0u8; 4096];
    while !shared.stop.load(Ordering::SeqCst) {
        // The ends present now (a vanished end is not polled).
        let ends: Vec<usize> = (0..2).filter(|&i| ptys[i].is_some()).collect();
        let mut fds = vec![PollFd::new(wake.as_fd(), PollFlags::POLLIN)];
        fds.extend(ends.iter().filter_map(|&i| {
            let p = ptys[i].as_ref()?;
            Some(PollFd::new(p.master.as_fd(), PollFlags::POLLIN))
        }));
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(_) => return,
        }
        let woken = fds[0].any().unwrap_or(false);
        let readable = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
        let mut ready = [false; 2];
        for (&end, fd) in ends.iter().zip(&fds[1..]) {
            ready[end] = fd.revents().is_some_and(|r| r.intersects(readable));
        }
        drop(fds);
        if woken {
            while matches!(unistd::read(&wake, &mut buf), Ok(n) if n > 0) {}
        }
        for from in 0..2 {
            if !ready[from] {
                continue;
            }
            let Some(src) = ptys[from].as_ref() else {
                continue;
            };
            let r = match unistd::read(&src.master, &mut buf) {
                Ok(r) if r > 0 => r,
                // EAGAIN, or EIO while no slave is open (cannot happen: we
                // hold one); nothing to forward this round.
                _ => continue,
            };
            let bytes = &buf[..r];
            let mut stats = shared.stats.lock().unwrap_or_else(|e| e.into_inner());
            if !shared.plugged.load(Ordering::SeqCst) {
                stats.bytes_dropped_unplugged += bytes.len() as u64;
                continue;
            }
            let written = write_some(ptys[1 - from].as_ref(), bytes);
            stats.bytes_forwarded[from] += written as u64;
            stats.bytes_dropped_overrun += (bytes.len() - written) as u64;
        }
        let commands: Vec<_> = shared
            .commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for (c, done) in commands {
            match c {
                Command::Garbage(end, bytes) => {
                    let written = write_some(ptys[end].as_ref(), &bytes);
                    let mut stats = shared.stats.lock().unwrap_or_else(|e| e.into_inner());
                    stats.garbage_bytes += written as u64;
                    stats.bytes_dropped_overrun += (bytes.len() - written) as u64;
                }
                Command::Vanish(end) => ptys[end] = None,
                Command::Reappear(end, pty) => ptys[end] = Some(pty),
                Command::Release(end) => {
                    if let Some(p) = &ptys[end] {
                        // SAFETY: an ioctl without arguments on a tty we hold.
                        unsafe { libc::ioctl(p.slave.as_raw_fd(), libc::TIOCNXCL) };
                    }
                }
            }
            let _ = done.send(());
        }
    }
}

/// Writes what the end's input queue takes; returns how many bytes.
fn write_some(to: Option<&Pty>, bytes: &[u8]) -> usize {
    let Some(to) = to else {
        return 0;
    };
    let mut done = 0;
    while done < bytes.len() {
        match unistd::write(&to.master, &bytes[done..]) {
            Ok(w) if w > 0 => done += w,
            _ => break,
        }
    }
    done
}

/// A new PTY with a raw, non-blocking master and the slave held open.
fn open_pty() -> io::Result<Pty> {
    let master = posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let path = PathBuf::from(ptsname_r(&master)?);
    let slave: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(&path)?
        .into();
    // Raw from the start: no echo back into the cable, no line
    // buffering, no CR/LF translation, even before an endpoint sets it.
    let mut t = termios::tcgetattr(&slave)?;
    termios::cfmakeraw(&mut t);
    termios::tcsetattr(&slave, SetArg::TCSANOW, &t)?;
    let master = OwnedFd::from(master);
    let flags = OFlag::from_bits_retain(fcntl(&master, FcntlArg::F_GETFL)?);
    fcntl(&master, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(Pty {
        master,
        slave,
        path,
    })
}

/// Points `link` at `target`, replacing any old link atomically.
fn relink(target: &Path, link: &Path) -> io::Result<()> {
    let tmp = link.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    std::fs::rename(&tmp, link)
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?)
}
