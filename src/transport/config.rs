//! Transport configuration: every bound and timer of the protocol, each
//! named with its unit, with defaults for a LAN of 3 to 5 hosts.
//!
//! Both ends of a link should run the same values: the receiver's
//! hold-back buffer must hold a sender's whole window, or frames are
//! dropped and re-requested.

use super::mac::MAC_BYTES;
use super::wire::{
    DATAGRAM_BYTES_MAX, DATA_FRAME_HEADER_BYTES, HEADER_BYTES, NACK_FRAME_HEADER_BYTES,
    NACK_RANGES_MAX, NACK_RANGE_BYTES,
};

/// IPv6 (40) plus UDP (8) header bytes: the part of the MTU that is not
/// ours. Over IPv4 this leaves 20 bytes unused; simpler than two limits.
pub const IP_UDP_HEADER_BYTES: usize = 48;

/// Tunables of one endpoint. See the table in
/// `docs/internals/transport.md`, "Configuration".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportConfig {
    /// Path MTU: the largest IP packet the path carries unfragmented
    /// (1500 for Ethernet, 9000 for jumbo frames). Datagrams are at most
    /// `mtu_bytes - 48` bytes.
    pub mtu_bytes: usize,
    /// Flow-control window per channel: payload bytes sent but not yet
    /// acknowledged. `send` returns `WouldBlock` beyond it.
    pub window_bytes: usize,
    /// Flow-control window per channel in frames (fragments), so that many
    /// small messages cannot overrun the receiver's hold-back slots.
    pub window_frames_max: usize,
    /// Retransmission history of the whole endpoint, payload bytes. When
    /// full, the oldest frames are dropped and a NACK for them is answered
    /// "too old".
    pub history_bytes_max: usize,
    /// Largest message `send` accepts and the receiver reassembles.
    pub message_bytes_max: usize,
    /// Out-of-order payload bytes held per channel waiting for a gap.
    pub holdback_bytes_max: usize,
    /// Out-of-order frames held per channel: seqs further than this ahead
    /// of the next one to deliver are dropped (and re-requested later).
    pub holdback_frames_max: usize,
    /// Delivered message bytes waiting in `poll_event`; beyond it incoming
    /// data is dropped unacknowledged until the caller drains events.
    pub events_bytes_max: usize,
    /// Floor of the reorder window (min RTT / 4) a gap waits before its
    /// first request, so a merely reordered frame causes no NACK; also
    /// the least time between two NACK rounds to a peer.
    pub nack_delay_min_us: u64,
    /// Ceiling of that window, and the window before the first RTT sample;
    /// up to a quarter of the window is added at random.
    pub nack_delay_max_us: u64,
    /// A gap still missing is asked for again after max(this, estimated
    /// RTO), in at most one round of repeats per peer per this interval;
    /// first requests of new gaps do not wait for it.
    pub nack_interval_ms: u64,
    /// Ranges per NACK frame (at most 255).
    pub nack_ranges_max: usize,
    /// Frames retransmitted in answer to one NACK datagram.
    pub rexmit_batch_max: usize,
    /// A frame is retransmitted at most once per this interval.
    pub rexmit_min_interval_ms: u64,
    /// A receiver acknowledges at most this long after new data arrives
    /// (earlier if a datagram is going to the peer anyway).
    pub ack_delay_us: u64,
    /// A receiver acknowledges at once after this many new payload bytes.
    pub ack_every_bytes: usize,
    /// With data unacknowledged and no ack for this long (or for the RTO
    /// plus `ack_delay_us`, if longer), the sender probes (announces how
    /// far it has sent, revealing a lost tail). Doubles on each unanswered
    /// probe, up to 64 times.
    pub probe_interval_ms: u64,
    /// Peers this endpoint talks to; datagrams from more are dropped.
    pub peers_max: usize,
    /// Channels (peer, group) of this endpoint.
    pub channels_max: usize,
    /// Past session epochs remembered per peer, so that datagrams of a
    /// restarted peer's earlier lives are recognised and dropped.
    pub retired_epochs_max: usize,
    /// A peer's epoch we retired comes back once it vouches for us (sends
    /// a datagram addressed to our epoch) and the epoch that replaced it
    /// has been silent this long: that one was a straggler of a dead life.
    pub epoch_silence_ms: u64,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            mtu_bytes: 1500,
            window_bytes: 4 << 20,
            window_frames_max: 4096,
            history_bytes_max: 64 << 20,
            message_bytes_max: 4 << 20,
            holdback_bytes_max: 4 << 20,
            holdback_frames_max: 4096,
            events_bytes_max: 16 << 20,
            nack_delay_min_us: 100,
            nack_delay_max_us: 500,
            nack_interval_ms: 4,
            nack_ranges_max: 64,
            rexmit_batch_max: 256,
            rexmit_min_interval_ms: 2,
            // Below `probe_interval_ms`, so an ack comes before a probe;
            // long enough for the next datagram to the peer to carry it
            // at light load (a standalone ack wakes the peer's loop).
            ack_delay_us: 2000,
            ack_every_bytes: 512 << 10,
            probe_interval_ms: 5,
            peers_max: 16,
            channels_max: 256,
            retired_epochs_max: 8,
            epoch_silence_ms: 500,
        }
    }
}

/// A configuration that cannot work, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid transport config: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

impl TransportConfig {
    /// The defaults with jumbo frames (MTU 9000).
    pub fn jumbo() -> Self {
        TransportConfig {
            mtu_bytes: 9000,
            ..Self::default()
        }
    }

    /// Largest datagram this endpoint builds, MAC included, in bytes.
    pub fn datagram_bytes_max(&self) -> usize {
        (self.mtu_bytes.saturating_sub(IP_UDP_HEADER_BYTES)).min(DATAGRAM_BYTES_MAX)
    }

    /// Largest message fragment: what one DATA frame carries when it has a
    /// datagram to itself.
    pub fn fragment_bytes_max(&self) -> usize {
        self.datagram_bytes_max()
            .saturating_sub(HEADER_BYTES + MAC_BYTES + DATA_FRAME_HEADER_BYTES)
            .min(u16::MAX as usize)
    }

    /// Fragments a message of `len` bytes is cut into (an empty message is
    /// one empty fragment).
    pub fn fragments(&self, len: usize) -> usize {
        len.div_ceil(self.fragment_bytes_max()).max(1)
    }

    /// Checks that the bounds fit together; the endpoint refuses to start
    /// otherwise.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |s: String| Err(ConfigError(s));
        if !(576..=65_535).contains(&self.mtu_bytes) {
            return err(format!("mtu_bytes {} not in 576..=65535", self.mtu_bytes));
        }
        if self.message_bytes_max == 0 || self.message_bytes_max > self.window_bytes {
            return err(format!(
                "message_bytes_max {} must be in 1..=window_bytes ({}): a message must fit an empty window",
                self.message_bytes_max, self.window_bytes
            ));
        }
        let frags = self.fragments(self.message_bytes_max);
        if frags > self.window_frames_max || frags > u16::MAX as usize {
            return err(format!(
                "a {}-byte message needs {frags} fragments of {} bytes: more than window_frames_max ({}) or 65535",
                self.message_bytes_max,
                self.fragment_bytes_max(),
                self.window_frames_max
            ));
        }
        if self.history_bytes_max < self.message_bytes_max {
            return err(format!(
                "history_bytes_max {} is smaller than one message ({})",
                self.history_bytes_max, self.message_bytes_max
            ));
        }
        if self.holdback_frames_max < self.window_frames_max
            || self.holdback_bytes_max < self.window_bytes
        {
            return err(format!(
                "the hold-back buffer ({} frames, {} bytes) must hold a whole window ({} frames, {} bytes)",
                self.holdback_frames_max,
                self.holdback_bytes_max,
                self.window_frames_max,
                self.window_bytes
            ));
        }
        if self.events_bytes_max < self.message_bytes_max {
            return err("events_bytes_max must hold at least one message".into());
        }
        if self.nack_delay_min_us > self.nack_delay_max_us {
            return err("nack_delay_min_us exceeds nack_delay_max_us".into());
        }
        if self.nack_interval_ms == 0 || self.probe_interval_ms == 0 || self.epoch_silence_ms == 0 {
            return err(
                "nack_interval_ms, probe_interval_ms and epoch_silence_ms must be positive".into(),
            );
        }
        if self.nack_ranges_max == 0 || self.nack_ranges_max > NACK_RANGES_MAX {
            return err(format!("nack_ranges_max must be in 1..={NACK_RANGES_MAX}"));
        }
        let nack_bytes = NACK_FRAME_HEADER_BYTES + self.nack_ranges_max * NACK_RANGE_BYTES;
        if HEADER_BYTES + nack_bytes + MAC_BYTES > self.datagram_bytes_max() {
            return err(
                "a full NACK frame does not fit in one datagram; lower nack_ranges_max".into(),
            );
        }
        if self.rexmit_batch_max == 0 {
            return err("rexmit_batch_max must be positive".into());
        }
        if self.ack_every_bytes == 0 {
            return err("ack_every_bytes must be positive".into());
        }
        if self.peers_max == 0 || self.channels_max == 0 {
            return err("peers_max and channels_max must be positive".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_jumbo_are_valid() {
        TransportConfig::default().validate().unwrap();
        TransportConfig::jumbo().validate().unwrap();
        let c = TransportConfig::default();
        assert_eq!(c.datagram_bytes_max(), 1452);
        assert_eq!(c.fragment_bytes_max(), 1452 - 48 - 16 - 20);
        assert_eq!(c.fragments(0), 1);
        assert_eq!(c.fragments(c.fragment_bytes_max() + 1), 2);
    }

    #[test]
    fn inconsistent_bounds_are_refused() {
        let bad = [
            TransportConfig {
                mtu_bytes: 100,
                ..Default::default()
            },
            TransportConfig {
                message_bytes_max: 8 << 20,
                ..Default::default()
            },
            TransportConfig {
                holdback_frames_max: 10,
                ..Default::default()
            },
            TransportConfig {
                nack_delay_min_us: 10,
                nack_delay_max_us: 5,
                ..Default::default()
            },
            TransportConfig {
                nack_ranges_max: 200,
                mtu_bytes: 600,
                message_bytes_max: 1 << 20,
                ..Default::default()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
    }
}
