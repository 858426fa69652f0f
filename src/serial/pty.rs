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

use std::collections::VecDeque;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
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
        unsafe { libc::write(self.wake.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
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
        let fd_of = |p: &Option<Pty>| p.as_ref().map_or(-1, |p| p.master.as_raw_fd());
        let mut fds = [
            pollfd(wake.as_raw_fd()),
            pollfd(fd_of(&ptys[0])),
            pollfd(fd_of(&ptys[1])),
        ];
        // Negative fds are ignored by poll(2): a vanished end.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 3, -1) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds[0].revents != 0 {
            while unsafe { libc::read(wake.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
        }
        for from in 0..2 {
            if fds[1 + from].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) == 0 {
                continue;
            }
            let Some(src) = ptys[from].as_ref() else {
                continue;
            };
            let r =
                unsafe { libc::read(src.master.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if r <= 0 {
                // EAGAIN, or EIO while no slave is open (cannot happen: we
                // hold one); nothing to forward this round.
                continue;
            }
            let bytes = &buf[..r as usize];
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
        let w = unsafe {
            libc::write(
                to.master.as_raw_fd(),
                bytes[done..].as_ptr().cast(),
                bytes.len() - done,
            )
        };
        if w <= 0 {
            break;
        }
        done += w as usize;
    }
    done
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A new PTY with a raw, non-blocking master and the slave held open.
fn open_pty() -> io::Result<Pty> {
    unsafe {
        let m = check(libc::posix_openpt(
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        ))?;
        let master = OwnedFd::from_raw_fd(m);
        check(libc::grantpt(m))?;
        check(libc::unlockpt(m))?;
        let mut name = [0 as libc::c_char; 128];
        let e = libc::ptsname_r(m, name.as_mut_ptr(), name.len());
        if e != 0 {
            return Err(io::Error::from_raw_os_error(e));
        }
        let path = PathBuf::from(
            std::ffi::CStr::from_ptr(name.as_ptr())
                .to_string_lossy()
                .into_owned(),
        );
        let cpath = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
        let s = check(libc::open(
            cpath.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        ))?;
        let slave = OwnedFd::from_raw_fd(s);
        // Raw from the start: no echo back into the cable, no line
        // buffering, no CR/LF translation, even before an endpoint sets it.
        let mut t: libc::termios = std::mem::zeroed();
        check(libc::tcgetattr(s, &mut t))?;
        libc::cfmakeraw(&mut t);
        check(libc::tcsetattr(s, libc::TCSANOW, &t))?;
        let fl = check(libc::fcntl(m, libc::F_GETFL))?;
        check(libc::fcntl(m, libc::F_SETFL, fl | libc::O_NONBLOCK))?;
        Ok(Pty {
            master,
            slave,
            path,
        })
    }
}

/// Points `link` at `target`, replacing any old link atomically.
fn relink(target: &Path, link: &Path) -> io::Result<()> {
    let tmp = link.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    std::fs::rename(&tmp, link)
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) })?;
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
