//! The out-of-band serial heartbeat, as a sans-IO core: the heartbeat
//! message ([`message`]), its framing on an RS-232 line ([`frame`]), replay
//! protection across restarts ([`replay`]), and the failure detector that
//! classifies every peer from what it heard on each channel ([`detector`]).
//!
//! Nothing here does I/O, reads a clock or draws randomness: the caller
//! passes `now_ms` (any node-local monotonic millisecond clock) and the
//! bytes it read, and gets back encoded frames, decoded heartbeats and
//! transition events. The serial port driver (`crate::serial`, which
//! decodes each line's frames), the node's control loop (the detector and
//! the failover policy) and the simulator are the callers; nothing here
//! imports them, the I/O layer, or the node wiring.
//!
//! Why a second channel at all (Linux-HA Heartbeat's lesson): seen only
//! over IP, a broken switch port looks exactly like a dead host. A
//! null-modem cable shares no NIC, driver, switch or power supply with the
//! IP path, so "UDP silent, serial alive" means *ip-partitioned*, not dead.

pub mod detector;
pub mod failover;
pub mod frame;
pub mod message;
pub mod replay;

pub use detector::{
    Channel, Detector, DetectorConfig, DetectorConfigError, DetectorStats, Event, LinkInfo,
    LinkStats, PeerStatus,
};
pub use frame::{
    decode_frame, encode_frame, DecoderStats, FrameDecoder, FrameError, FRAME_BYTES_MAX,
};
pub use message::{GroupStatus, Heartbeat, LinkState, MessageError, PeerView};
pub use replay::{Freshness, ReplayGuard};
