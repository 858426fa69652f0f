//! The serial-port driver of the heartbeat: the only code that touches a
//! tty. It owns opening the device raw (8N1, no flow control, configured
//! baud), writing frames, reading bytes into the sans-IO
//! [`crate::heartbeat::FrameDecoder`], and reopening a device that failed
//! or vanished, with bounded exponential backoff ([`port`]). What the
//! frames mean and when a link is dead is the heartbeat core's business;
//! nothing here second-guesses it.
//!
//! [`pty`] is a null-modem cable emulated on pseudo-terminals, for tests
//! and `quire up`: it can be unplugged, replugged, made noisy, and either
//! end's device can vanish and come back.
//!
//! Nothing here reads a clock or spawns threads, except the emulator's one
//! forwarding thread. Only the owning thread touches a port.

pub mod port;
pub mod pty;

pub use port::{PortState, PortStats, SerialConfig, SerialPort};
pub use pty::{CableStats, End, NullModem};
