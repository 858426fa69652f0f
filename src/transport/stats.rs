//! Counters the endpoint keeps: for the whole endpoint, per peer and per
//! channel. Plain data; names say what they count and in which unit.

/// What happened to datagrams before they reached a peer: the drops that
/// cannot be attributed to a peer because the sender is not trusted yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Datagrams passed to `handle_datagram`.
    pub datagrams_received: u64,
    /// Dropped: the MAC did not match (forged, corrupted, or another key).
    pub mac_failures: u64,
    /// Dropped: too short or long, wrong magic or version, or a bad
    /// header or frame behind a valid MAC.
    pub malformed_dropped: u64,
    /// Dropped: addressed to another node, or claiming to come from us.
    pub misaddressed_dropped: u64,
    /// Dropped: from a new peer beyond `peers_max`.
    pub peers_over_limit_dropped: u64,
    /// Frames dropped because their channel would exceed `channels_max`.
    pub channels_over_limit_dropped: u64,
    /// Frames dropped from the history before being acknowledged, because
    /// the history reached `history_bytes_max`.
    pub history_evicted_frames: u64,
    /// Payload bytes in the history now (gauge).
    pub history_bytes: u64,
}

/// Counters per peer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Datagrams built for this peer.
    pub datagrams_sent: u64,
    /// Bytes of those datagrams.
    pub bytes_sent: u64,
    /// Authenticated datagrams received from this peer.
    pub datagrams_received: u64,
    /// Bytes of those datagrams.
    pub bytes_received: u64,
    /// Dropped: from one of the peer's earlier lives, or addressed to one
    /// of ours (replays across restarts).
    pub stale_epoch_dropped: u64,
    /// Times the peer was seen to restart (a new session epoch).
    pub restarts_seen: u64,
    /// NACK rounds sent: rounds of first requests (at most one per
    /// `nack_delay_min_us`) and rounds that repeat requests.
    pub nack_rounds: u64,
    /// NACK rounds that repeated a request (at most one per
    /// `nack_interval_ms`).
    pub nack_repeat_rounds: u64,
    /// Smoothed round-trip time in µs (RFC 6298); 0 before the first sample.
    pub rtt_us: u64,
    /// Round-trip time variation in µs.
    pub rtt_var_us: u64,
    /// Lowest round-trip sample of the last 10 s in µs: the path without
    /// queues, from which the reorder window is derived.
    pub rtt_min_us: u64,
    /// Round-trip samples taken.
    pub rtt_samples: u64,
}

/// Counters per channel (peer, group), both directions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelStats {
    /// Messages accepted by `send`.
    pub messages_sent: u64,
    /// Payload bytes of those messages.
    pub message_bytes_sent: u64,
    /// DATA frames sent for the first time.
    pub frames_sent: u64,
    /// `send` refused with `WouldBlock`: the window was full.
    pub window_stalls: u64,
    /// NACK frames received.
    pub nacks_received: u64,
    /// Frames retransmitted.
    pub rexmit_frames: u64,
    /// Payload bytes retransmitted.
    pub rexmit_bytes: u64,
    /// Retransmissions asked for but held back by `rexmit_min_interval_ms`
    /// or `rexmit_batch_max`.
    pub rexmit_suppressed: u64,
    /// TOO_OLD answers sent.
    pub too_old_sent: u64,
    /// Messages delivered to the caller.
    pub messages_delivered: u64,
    /// Payload bytes of those messages.
    pub message_bytes_delivered: u64,
    /// DATA frames received and accepted.
    pub frames_received: u64,
    /// DATA frames received twice (network duplicates, replays, or
    /// retransmissions that crossed the original) and dropped.
    pub duplicates_dropped: u64,
    /// DATA frames dropped because the hold-back buffer or the event queue
    /// was full; the sender will be asked again.
    pub holdback_dropped: u64,
    /// NACK frames sent.
    pub nacks_sent: u64,
    /// Seqs requested, summed over NACK frames (a seq asked twice counts
    /// twice): the numerator of the implosion bound.
    pub nack_seqs_requested: u64,
    /// Of those, requests that repeated an earlier one.
    pub nack_seqs_repeated: u64,
    /// Missing frames that arrived after being requested.
    pub gaps_filled: u64,
    /// Missing frames skipped because the sender answered "too old".
    pub gaps_skipped: u64,
    /// TOO_OLD answers received.
    pub too_old_received: u64,
    /// Messages dropped half-reassembled (a skipped fragment, or a sender
    /// breaking the fragment rules).
    pub reassembly_aborted: u64,
    /// Probes (acks asking for an immediate answer) sent.
    pub probes_sent: u64,
}

/// The positions of a channel now, for status displays and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelState {
    /// Next seq `send` will assign.
    pub send_next: u64,
    /// Every seq below this is acknowledged by the peer.
    pub acked: u64,
    /// Lowest seq still in the history (equal to `send_next` if none).
    pub history_base: u64,
    /// Payload bytes sent and not yet acknowledged.
    pub in_flight_bytes: u64,
    /// Next seq to deliver from the peer.
    pub recv_next: u64,
    /// Frames held back waiting for a gap.
    pub holdback_frames: u64,
    /// Payload bytes held back.
    pub holdback_bytes: u64,
}
