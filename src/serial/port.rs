//! One serial port carrying heartbeat frames: opened raw 8N1 with no flow
//! control at the configured baud, non-blocking; frames written whole when
//! the line takes them, bytes read into a [`FrameDecoder`]. When the device
//! fails or vanishes (a USB adapter pulled out), the port closes and is
//! reopened with exponential backoff; nothing here panics or gives up.
//!
//! Only the owning thread touches a port. It reads no clock: the caller
//! passes `now_ms` (used only for the reopen backoff).

use nix::errno::Errno;
use nix::sys::termios::{
    self, BaudRate, ControlFlags, FlushArg, InputFlags, SetArg, SpecialCharacterIndices,
};
use nix::unistd;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use crate::heartbeat::frame::{DecoderStats, FrameDecoder, FrameError, FRAME_BYTES_MAX};
use crate::heartbeat::Heartbeat;
use crate::transport::ClusterKey;

/// Bytes read per `read(2)` call.
const READ_CHUNK_BYTES: usize = 4096;
/// `read(2)` calls per [`SerialPort::receive`]: a bound on the work one
/// call does if the line delivers faster than we read.
const READS_PER_RECEIVE_MAX: usize = 16;

/// Where and how to open the port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SerialConfig {
    /// The tty device, e.g. `/dev/ttyS0` or a `/dev/serial/by-id/...` link.
    pub device: PathBuf,
    /// Line speed in bits per second (a standard rate, 1200 to 4000000).
    pub baud: u32,
    /// First wait before reopening a failed port.
    pub reopen_backoff_min_ms: u64,
    /// The wait doubles on each failure up to this.
    pub reopen_backoff_max_ms: u64,
    /// Bytes queued for the line at most (frames beyond are dropped: a
    /// fresher heartbeat follows within `keepalive_ms`).
    pub tx_bytes_max: usize,
}

impl SerialConfig {
    /// Defaults for `device`: 115200 baud, backoff 100 ms to 5 s, two frames of queue.
    pub fn new(device: impl Into<PathBuf>) -> Self {
        SerialConfig {
            device: device.into(),
            baud: 115_200,
            reopen_backoff_min_ms: 100,
            reopen_backoff_max_ms: 5_000,
            tx_bytes_max: 2 * FRAME_BYTES_MAX,
        }
    }

    /// Microseconds `bytes` take on the line: 10 bits a byte at 8N1 (start,
    /// 8 data, stop). A heartbeat's airtime must stay well under
    /// `keepalive_ms`, or heartbeats queue up and arrive late.
    pub fn airtime_us(&self, bytes: usize) -> u64 {
        (bytes as u64 * 10 * 1_000_000).div_ceil(self.baud.max(1) as u64)
    }

    /// Checks the baud rate and bounds.
    pub fn validate(&self) -> Result<(), String> {
        if baud_constant(self.baud).is_none() {
            return Err(format!(
                "baud {} is not a standard rate (1200..=4000000)",
                self.baud
            ));
        }
        if self.reopen_backoff_min_ms == 0
            || self.reopen_backoff_max_ms < self.reopen_backoff_min_ms
        {
            return Err("need 0 < reopen_backoff_min_ms <= reopen_backoff_max_ms".into());
        }
        if self.tx_bytes_max < FRAME_BYTES_MAX {
            return Err(format!(
                "tx_bytes_max must hold one frame ({FRAME_BYTES_MAX} bytes)"
            ));
        }
        Ok(())
    }
}

/// Whether the port is usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// Open; frames go out and come in.
    Open,
    /// Closed after a failure (or not opened yet); the next attempt is due
    /// at `retry_at_ms`.
    Closed {
        /// When `poll_open` will try again.
        retry_at_ms: u64,
    },
}

/// Counters of one port; names say what they count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Successful opens.
    pub opens: u64,
    /// Failed open attempts (device missing, busy, not a tty).
    pub open_failures: u64,
    /// Times an open port was closed because it failed or vanished.
    pub device_lost: u64,
    /// Bytes read from the line.
    pub bytes_read: u64,
    /// Bytes written to the line.
    pub bytes_written: u64,
    /// Frames queued for the line.
    pub frames_sent: u64,
    /// Frames dropped: port closed.
    pub frames_dropped_closed: u64,
    /// Frames dropped: the line did not drain `tx_bytes_max` in time.
    pub frames_dropped_full: u64,
}

/// A serial port carrying heartbeat frames. See the module doc.
#[derive(Debug)]
pub struct SerialPort {
    cfg: SerialConfig,
    fd: Option<OwnedFd>,
    state: PortState,
    backoff_ms: u64,
    decoder: FrameDecoder,
    tx: Vec<u8>,
    stats: PortStats,
    last_error: Option<String>,
}

impl SerialPort {
    /// A closed port; the first `poll_open` opens it. Frames are checked
    /// with `key`.
    pub fn new(cfg: SerialConfig, key: ClusterKey) -> Result<Self, String> {
        cfg.validate()?;
        Ok(SerialPort {
            backoff_ms: cfg.reopen_backoff_min_ms,
            cfg,
            fd: None,
            state: PortState::Closed { retry_at_ms: 0 },
            decoder: FrameDecoder::new(key),
            tx: Vec::new(),
            stats: PortStats::default(),
            last_error: None,
        })
    }

    /// Opens the port if it is closed and its retry time has come; returns
    /// the state after. Call before sending and receiving.
    pub fn poll_open(&mut self, now_ms: u64) -> PortState {
        if let PortState::Closed { retry_at_ms } = self.state {
            if now_ms >= retry_at_ms {
                match open_raw(&self.cfg) {
                    Ok(fd) => {
                        self.fd = Some(fd);
                        self.state = PortState::Open;
                        self.stats.opens += 1;
                        self.decoder.reset();
                        self.tx.clear();
                    }
                    Err(e) => {
                        self.stats.open_failures += 1;
                        self.fail(now_ms, format!("open {}: {e}", self.cfg.device.display()));
                    }
                }
            }
        }
        self.state
    }

    /// Queues one encoded frame and writes what the line takes. False if
    /// the frame was dropped (port closed, or the queue full).
    pub fn send_frame(&mut self, now_ms: u64, frame: &[u8]) -> bool {
        if self.fd.is_none() {
            self.stats.frames_dropped_closed += 1;
            return false;
        }
        self.flush(now_ms);
        if self.tx.len() + frame.len() > self.cfg.tx_bytes_max {
            self.stats.frames_dropped_full += 1;
            return false;
        }
        self.tx.extend_from_slice(frame);
        self.stats.frames_sent += 1;
        self.flush(now_ms);
        true
    }

    /// Writes queued bytes the line will take now.
    pub fn flush(&mut self, now_ms: u64) {
        while !self.tx.is_empty() {
            let Some(fd) = self.fd.as_ref() else {
                return;
            };
            match unistd::write(fd, &self.tx) {
                Ok(w) if w > 0 => {
                    self.tx.drain(..w);
                    self.stats.bytes_written += w as u64;
                }
                Ok(_) | Err(Errno::EAGAIN) => return,
                Err(Errno::EINTR) => {}
                Err(e) => return self.lost(now_ms, format!("write: {}", io::Error::from(e))),
            }
        }
    }

    /// Reads what the line has delivered into the decoder; returns the
    /// bytes read. Then drain [`SerialPort::next_frame`].
    pub fn receive(&mut self, now_ms: u64) -> usize {
        let mut buf = [0u8; READ_CHUNK_BYTES];
        let mut total = 0;
        for _ in 0..READS_PER_RECEIVE_MAX {
            let Some(fd) = self.fd.as_ref() else {
                break;
            };
            match unistd::read(fd, &mut buf) {
                Ok(0) => {
                    // End of file on a tty: the device is gone (hang-up).
                    self.lost(now_ms, "read: end of file (device gone)".into());
                    break;
                }
                Ok(n) => {
                    self.decoder.push(&buf[..n]);
                    self.stats.bytes_read += n as u64;
                    total += n;
                    // The device works: the next failure starts from the
                    // shortest backoff again.
                    self.backoff_ms = self.cfg.reopen_backoff_min_ms;
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => break,
                // EIO, ENXIO, ENODEV: the adapter or the PTY went away.
                Err(e) => {
                    self.lost(now_ms, format!("read: {}", io::Error::from(e)));
                    break;
                }
            }
        }
        total
    }

    /// The next decoded heartbeat or rejected frame.
    #[must_use]
    pub fn next_frame(&mut self) -> Option<Result<Heartbeat, FrameError>> {
        self.decoder.next_frame()
    }

    /// The descriptor to wait on while open: POLLIN, and POLLHUP/POLLERR
    /// (a hang-up), both mean "call `receive`".
    pub fn raw_fd(&self) -> Option<RawFd> {
        self.fd.as_ref().map(|f| f.as_raw_fd())
    }

    /// True if queued bytes wait for the line (wait for POLLOUT too).
    pub fn wants_write(&self) -> bool {
        self.fd.is_some() && !self.tx.is_empty()
    }

    /// Open, or closed until when.
    pub fn state(&self) -> PortState {
        self.state
    }

    /// The port's counters.
    pub fn stats(&self) -> &PortStats {
        &self.stats
    }

    /// The frame decoder's counters.
    pub fn decoder_stats(&self) -> &DecoderStats {
        self.decoder.stats()
    }

    /// What went wrong last, for logs and `quire status`.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// The configuration.
    pub fn config(&self) -> &SerialConfig {
        &self.cfg
    }

    fn lost(&mut self, now_ms: u64, why: String) {
        self.stats.device_lost += 1;
        self.fail(now_ms, why);
    }

    /// Closes the port and schedules a reopen after the current backoff,
    /// which doubles for next time (bounded).
    fn fail(&mut self, now_ms: u64, why: String) {
        self.fd = None;
        self.tx.clear();
        self.state = PortState::Closed {
            retry_at_ms: now_ms.saturating_add(self.backoff_ms),
        };
        self.backoff_ms = (self.backoff_ms * 2).min(self.cfg.reopen_backoff_max_ms);
        self.last_error = Some(why);
    }
}

/// Opens `cfg.device` as a raw 8N1 line, no flow control, non-blocking.
fn open_raw(cfg: &SerialConfig) -> io::Result<OwnedFd> {
    let speed =
        baud_constant(cfg.baud).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let fd: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(&cfg.device)?
        .into();
    // Fails with ENOTTY on anything that is not a terminal.
    let mut t = termios::tcgetattr(&fd)?;
    termios::cfmakeraw(&mut t);
    // 8 data bits, no parity, one stop bit; ignore modem control lines
    // (a null-modem cable may not wire DCD); no hardware or software
    // flow control, which a stuck peer could use to block our writes.
    t.control_flags &= !(ControlFlags::CSIZE
        | ControlFlags::PARENB
        | ControlFlags::CSTOPB
        | ControlFlags::CRTSCTS);
    t.control_flags |= ControlFlags::CS8 | ControlFlags::CLOCAL | ControlFlags::CREAD;
    t.input_flags &= !(InputFlags::IXON | InputFlags::IXOFF | InputFlags::IXANY);
    // VMIN 1, VTIME 0 with O_NONBLOCK: an empty queue reads EAGAIN, so
    // a read of 0 bytes means hang-up (device gone). With VMIN 0 Linux
    // returns 0 for "no data" too, and the two could not be told apart.
    t.control_chars[SpecialCharacterIndices::VMIN as usize] = 1;
    t.control_chars[SpecialCharacterIndices::VTIME as usize] = 0;
    termios::cfsetispeed(&mut t, speed)?;
    termios::cfsetospeed(&mut t, speed)?;
    termios::tcsetattr(&fd, SetArg::TCSANOW, &t)?;
    // Whatever waited in the queues is from before: stale.
    termios::tcflush(&fd, FlushArg::TCIOFLUSH)?;
    // Exclusive: a second process opening the port would steal bytes.
    // Best effort (not every driver supports it).
    // SAFETY: TIOCEXCL takes no argument; `fd` is the tty opened above.
    unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCEXCL) };
    Ok(fd)
}

/// The termios constant for a baud rate.
fn baud_constant(baud: u32) -> Option<BaudRate> {
    Some(match baud {
        1200 => BaudRate::B1200,
        2400 => BaudRate::B2400,
        4800 => BaudRate::B4800,
        9600 => BaudRate::B9600,
        19_200 => BaudRate::B19200,
        38_400 => BaudRate::B38400,
        57_600 => BaudRate::B57600,
        115_200 => BaudRate::B115200,
        230_400 => BaudRate::B230400,
        460_800 => BaudRate::B460800,
        500_000 => BaudRate::B500000,
        576_000 => BaudRate::B576000,
        921_600 => BaudRate::B921600,
        1_000_000 => BaudRate::B1000000,
        1_152_000 => BaudRate::B1152000,
        1_500_000 => BaudRate::B1500000,
        2_000_000 => BaudRate::B2000000,
        2_500_000 => BaudRate::B2500000,
        3_000_000 => BaudRate::B3000000,
        3_500_000 => BaudRate::B3500000,
        4_000_000 => BaudRate::B4000000,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_rejects_odd_baud_and_bounds() {
        let ok = SerialConfig::new("/dev/ttyS0");
        assert_eq!(ok.baud, 115_200);
        ok.validate().unwrap();
        assert!(SerialConfig {
            baud: 115_000,
            ..ok.clone()
        }
        .validate()
        .is_err());
        assert!(SerialConfig {
            reopen_backoff_min_ms: 0,
            ..ok.clone()
        }
        .validate()
        .is_err());
        assert!(SerialConfig {
            reopen_backoff_max_ms: 1,
            ..ok.clone()
        }
        .validate()
        .is_err());
        assert!(SerialConfig {
            tx_bytes_max: 10,
            ..ok.clone()
        }
        .validate()
        .is_err());
        // The figures the heartbeat docs quote: 165 bytes 14 ms, 502 bytes
        // 43.6 ms ("44").
        assert_eq!(ok.airtime_us(165), 14_323);
        assert_eq!(ok.airtime_us(FRAME_BYTES_MAX), 43_577);
    }

    #[test]
    fn missing_device_backs_off_exponentially_to_the_bound() {
        let cfg = SerialConfig {
            reopen_backoff_min_ms: 100,
            reopen_backoff_max_ms: 1000,
            ..SerialConfig::new("/nonexistent/quire-tty")
        };
        let mut p = SerialPort::new(cfg, ClusterKey::derive(b"k")).unwrap();
        let mut now = 0;
        let mut waits = Vec::new();
        for _ in 0..7 {
            let PortState::Closed { retry_at_ms } = p.poll_open(now) else {
                panic!("opened a missing device");
            };
            // Not due yet: no attempt.
            assert_eq!(
                p.poll_open(retry_at_ms - 1),
                PortState::Closed { retry_at_ms }
            );
            waits.push(retry_at_ms - now);
            now = retry_at_ms;
        }
        assert_eq!(waits, vec![100, 200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(p.stats().open_failures, 7);
        assert!(p.last_error().unwrap().contains("quire-tty"));
        assert!(!p.send_frame(now, &[0, 1, 0]));
        assert_eq!(p.stats().frames_dropped_closed, 1);
        assert_eq!(p.receive(now), 0);
    }

    #[test]
    fn a_file_that_is_not_a_tty_is_refused() {
        let f = std::env::temp_dir().join(format!("quire-not-a-tty-{}", std::process::id()));
        std::fs::write(&f, b"x").unwrap();
        let mut p = SerialPort::new(SerialConfig::new(&f), ClusterKey::derive(b"k")).unwrap();
        assert!(matches!(p.poll_open(0), PortState::Closed { .. }));
        assert_eq!(p.stats().open_failures, 1);
        let _ = std::fs::remove_file(&f);
    }
}
