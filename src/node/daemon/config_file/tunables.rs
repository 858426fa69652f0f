//! The checks of the tunable sections: timers, client limits, snapshots,
//! storage, the transport and the serial line, each over the defaults of
//! the config it feeds, and whether an entry fits what the transport
//! carries. Each returns the first fault, naming its key. None binds a
//! port, opens a log or writes a file.

use super::raw::{RawClient, RawSerial, RawSnapshot, RawStorage, RawTimers, RawTransport};
use super::{bad, in_section, Bad, SERIAL_BAUD_DEFAULT};
use crate::consensus::{NodeId, RaftConfig};
use crate::heartbeat::message::GROUPS_MAX;
use crate::heartbeat::DetectorConfig;
use crate::io::BackendChoice;
use crate::node::client::admission::ClientLimits;
use crate::node::spec::PeerSpec;
use crate::serial::SerialConfig;
use crate::storage::format::BLOCK_BYTES;
use crate::storage::WalConfig;
use crate::transport::TransportConfig;

/// `[timers]`: the detector's (its own check) and Raft's.
pub(super) fn timers(
    raw: RawTimers,
    id: NodeId,
    voters: Vec<NodeId>,
    warnings: &mut Vec<String>,
) -> Result<(DetectorConfig, RaftConfig), Bad> {
    let t = raw;
    let mut detector = DetectorConfig::default();
    set_present!(detector, t; keepalive_ms, warntime_ms, deadtime_ms, initdead_ms,
        disk_stall_ms);
    detector.validate().map_err(|e| in_section("timers", e.0))?;
    let mut raft = RaftConfig::new(id, voters);
    set_present!(raft, t; election_timeout_ms, heartbeat_interval_ms, fast_campaign_jitter_ms,
        preferred_leader_hold_ms);
    // Raft's own check, under the key of the field at fault: of this
    // section's keys only the timers can be wrong (id is node.id, checked
    // first; the limits are not in the file).
    raft.validate().map_err(|e| match e.field() {
        f @ ("election_timeout_ms"
        | "heartbeat_interval_ms"
        | "fast_campaign_jitter_ms"
        | "preferred_leader_hold_ms") => bad(format!("timers.{f}"), e.reason()),
        _ => bad("timers", e.to_string()),
    })?;
    if detector.deadtime_ms < 5 * detector.keepalive_ms {
        warnings.push(format!(
            "timers.deadtime_ms: {} is under five keepalives ({} ms): a few lost heartbeats look like death",
            detector.deadtime_ms,
            5 * detector.keepalive_ms
        ));
    }
    Ok((detector, raft))
}

/// `[client]`: the client server's connection bounds.
pub(super) fn client(raw: &RawClient) -> Result<ClientLimits, Bad> {
    let mut limits = ClientLimits::default();
    set_present!(limits, raw; hello_timeout_ms, connections_max, unauthenticated_max,
        connections_per_source_max);
    limits.validate().map_err(|e| in_section("client", e))?;
    Ok(limits)
}

/// `[snapshot]`: when to take one (`entries` or `bytes` of log growth,
/// and at least every `interval_ms`), and the chunks images stream in;
/// returns the interval.
pub(super) fn snapshot(raw: RawSnapshot, raft: &mut RaftConfig) -> Result<u64, Bad> {
    if let Some(n) = raw.entries {
        if n == 0 {
            return Err(bad("snapshot.entries", "must be at least 1"));
        }
        raft.snapshot_entries = n;
    }
    if let Some(n) = raw.bytes {
        if n == 0 {
            return Err(bad("snapshot.bytes", "must be at least 1"));
        }
        raft.snapshot_bytes = n;
    }
    if let Some(n) = raw.chunk_bytes {
        let Some(n) = usize::try_from(n).ok().filter(|&n| n >= 4096) else {
            return Err(bad("snapshot.chunk_bytes", "must be at least 4096"));
        };
        raft.snapshot_chunk_bytes = n;
    }
    match raw.interval_ms {
        Some(0) => Err(bad("snapshot.interval_ms", "must be at least 1")),
        Some(ms) => Ok(ms),
        None => Ok(crate::node::spec::SNAPSHOT_INTERVAL_MS),
    }
}

/// `[storage]`: the WAL's rules, caught before any disk is touched.
pub(super) fn storage(raw: RawStorage, disk_stall_ms: u64) -> Result<WalConfig, Bad> {
    let s = raw;
    let mut wal = WalConfig {
        disk_stall_ms,
        ..WalConfig::default()
    };
    if let Some(b) = &s.backend {
        wal.backend = b
            .parse::<BackendChoice>()
            .map_err(|e| bad("storage.backend", e))?;
    }
    set_present!(wal, s; segment_bytes, flush_bytes_max, flushes_in_flight_max, direct_io,
        read_cache_bytes, scrub_bytes_per_s, space_retry_ms, segments_ahead, segments_recycled_max);
    if wal.flush_bytes_max == 0 {
        return Err(bad("storage.flush_bytes_max", "must be at least 1"));
    }
    // The rule `Wal::open` enforces, caught before any disk is touched.
    if wal.segment_bytes % BLOCK_BYTES as u64 != 0
        || wal.segment_bytes < 2 * wal.flush_bytes_max as u64
    {
        return Err(bad(
            "storage.segment_bytes",
            format!(
                "{} must be a multiple of {BLOCK_BYTES} and at least twice flush_bytes_max ({})",
                wal.segment_bytes, wal.flush_bytes_max
            ),
        ));
    }
    if wal.flushes_in_flight_max == 0 {
        return Err(bad("storage.flushes_in_flight_max", "must be at least 1"));
    }
    if wal.space_retry_ms == 0 {
        return Err(bad("storage.space_retry_ms", "must be at least 1"));
    }
    Ok(wal)
}

/// Warns when this node's log could not store every entry one transport
/// message can carry. A group's leader limits entries to what its own log
/// stores, so a cluster whose nodes share `segment_bytes` is safe either
/// way; a node with smaller segments than its leader would have its log
/// stopped by an entry it cannot store.
pub(super) fn entries_fit(
    wal: &WalConfig,
    transport: &TransportConfig,
    warnings: &mut Vec<String>,
) {
    let stored = crate::storage::wal::entry_bytes_max(wal);
    if stored < transport.message_bytes_max {
        warnings.push(format!(
            "storage.segment_bytes: {} holds entries up to {stored} bytes (half a segment), less than transport.message_bytes_max ({}): give every node of the cluster the same segment_bytes, or at least {}",
            wal.segment_bytes,
            transport.message_bytes_max,
            2 * transport.message_bytes_max as u64
        ));
    }
}

/// `[transport]`: the endpoint's own check, and room for every peer.
pub(super) fn transport(raw: RawTransport, peers: usize) -> Result<TransportConfig, Bad> {
    let tr = raw;
    let mut transport = TransportConfig::default();
    set_present!(transport, tr; mtu_bytes, window_bytes, window_frames_max, history_bytes_max,
        message_bytes_max, holdback_bytes_max, holdback_frames_max, events_bytes_max,
        nack_delay_min_us, nack_delay_max_us, nack_interval_ms, nack_ranges_max,
        rexmit_batch_max, rexmit_min_interval_ms, ack_delay_us, ack_every_bytes,
        probe_interval_ms, peers_max, channels_max, retired_epochs_max, epoch_silence_ms);
    transport
        .validate()
        .map_err(|e| in_section("transport", e.0))?;
    if peers > transport.peers_max {
        return Err(bad(
            "transport.peers_max",
            format!("{} is fewer than the {} peers", transport.peers_max, peers),
        ));
    }
    Ok(transport)
}

/// `[serial]`: a standard baud, and a heartbeat that fits the keepalive.
pub(super) fn serial(
    raw: RawSerial,
    peers: &[PeerSpec],
    groups_per_core_max: usize,
    keepalive_ms: u64,
    warnings: &mut Vec<String>,
) -> Result<u32, Bad> {
    let serial_baud = raw.baud.unwrap_or(SERIAL_BAUD_DEFAULT);
    SerialConfig {
        baud: serial_baud,
        ..SerialConfig::new("")
    }
    .validate()
    .map_err(|e| in_section("serial", e))?;
    if peers.iter().any(|p| p.serial_device.is_some()) {
        // A heartbeat on the line: 30 header + 46 a group + 10 a peer,
        // plus about 23 of MAC, envelope and framing (142 -> 165 bytes).
        let line_bytes = 30 + 46 * groups_per_core_max.min(GROUPS_MAX) + 10 * peers.len() + 23;
        let airtime_ms = SerialConfig {
            baud: serial_baud,
            ..SerialConfig::new("")
        }
        .airtime_us(line_bytes)
            / 1000;
        if airtime_ms * 2 > keepalive_ms {
            warnings.push(format!(
                "serial.baud: a heartbeat ({line_bytes} bytes) takes {airtime_ms} ms on the line at {serial_baud} baud, over half of keepalive_ms ({}): raise the baud or the keepalive",
                keepalive_ms
            ));
        }
    }
    Ok(serial_baud)
}
