//! The log's configuration, errors, health and metrics, and what `open` reports.

use crate::consensus::RestoredState;
use crate::io::BackendChoice;
use crate::storage::recovery::{Corruption, TornTail};
use hdrhistogram::Histogram;
use std::io;
use std::time::Duration;

/// Configuration of one log.
#[derive(Clone, Debug)]
pub struct WalConfig {
    /// Size of each segment file, preallocated with zeros.
    pub segment_bytes: u64,
    /// A batch is cut, and may go out early, at this many bytes.
    pub flush_bytes_max: usize,
    /// Flushes that may be in flight at once (recovery needs the bound).
    pub flushes_in_flight_max: u32,
    /// A flush slower than this marks the disk degraded.
    pub disk_stall_ms: u64,
    /// I/O backend.
    pub backend: BackendChoice,
    /// Try O_DIRECT (falls back to buffered writes where refused).
    pub direct_io: bool,
    /// Bytes of recently read batches kept decoded.
    pub read_cache_bytes: usize,
    /// The background scrub's read rate over every batch the log keeps
    /// (bytes/s, at low I/O priority); 0 turns it off.
    pub scrub_bytes_per_s: u64,
    /// While the disk is full, how often to try preparing a segment again.
    pub space_retry_ms: u64,
    /// Spare segments kept ready ahead of the one being written; when
    /// fewer are ready, one is zero-filled in the background.
    pub segments_ahead: u32,
    /// Trimmed segments kept as spares for reuse (renamed, not rewritten)
    /// instead of being deleted; beyond this many spares they are deleted.
    /// A config file that leaves it out gets [`segments_recycled_for`] its
    /// snapshot size.
    pub segments_recycled_max: u32,
    /// A planted bug for the simulator's checkers, never set by a config
    /// file: recovery truncates the log at damage in its middle, as if it
    /// were a torn tail, instead of reporting it for repair.
    pub planted_truncate_on_corruption: bool,
}

impl Default for WalConfig {
    fn default() -> Self {
        WalConfig {
            segment_bytes: 64 << 20,
            flush_bytes_max: 1 << 20,
            flushes_in_flight_max: 2,
            disk_stall_ms: 2_000,
            backend: BackendChoice::Auto,
            direct_io: true,
            read_cache_bytes: 8 << 20,
            scrub_bytes_per_s: SCRUB_BYTES_PER_S,
            space_retry_ms: 100,
            segments_ahead: 1,
            segments_recycled_max: SEGMENTS_RECYCLED_MIN,
            planted_truncate_on_corruption: false,
        }
    }
}

/// Default `scrub_bytes_per_s`: 8 MiB/s, a sliver of a data-centre
/// disk's bandwidth (a pass over 100 GiB kept takes about 3.5 hours).
pub(crate) const SCRUB_BYTES_PER_S: u64 = 8 << 20;

/// Fewest trimmed segments kept for reuse.
const SEGMENTS_RECYCLED_MIN: u32 = 4;
/// Most trimmed segments kept for reuse when the count is derived.
const SEGMENTS_RECYCLED_DERIVED_MAX: u32 = 256;

/// Trimmed segments to keep for reuse when a snapshot is taken every
/// `snapshot_bytes` of log in segments of `segment_bytes`: one snapshot's
/// trim (plus two partly covered segments), so that in steady state every
/// new segment is a recycled one and none is zero-filled: a log trimmed
/// 8 segments at a time that kept 4 zero-filled the other half, writing
/// every byte of those segments twice. At least 4, at most 256.
pub fn segments_recycled_for(snapshot_bytes: u64, segment_bytes: u64) -> u32 {
    let per_trim = snapshot_bytes
        .div_ceil(segment_bytes.max(1))
        .saturating_add(2);
    per_trim.clamp(
        SEGMENTS_RECYCLED_MIN as u64,
        SEGMENTS_RECYCLED_DERIVED_MAX as u64,
    ) as u32
}

/// Why a log operation failed.
#[derive(Debug)]
pub enum WalError {
    /// An I/O error, with what was being done.
    Io(String, io::Error),
    /// The disk is full: new appends are not admitted until space returns.
    DiskFull,
    /// A flush failed earlier; this log is stopped on this node.
    Stopped(String),
    /// The directory holds something recovery cannot accept.
    Corrupt(String),
    /// A request the log cannot serve (entry too large, index not held).
    Invalid(String),
}

impl std::fmt::Display for WalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WalError::Io(what, e) => write!(f, "{what}: {e}"),
            WalError::DiskFull => write!(f, "disk full: appends are refused until space is freed"),
            WalError::Stopped(why) => write!(f, "log stopped after an I/O error: {why}"),
            WalError::Corrupt(why) => write!(f, "log directory is damaged: {why}"),
            WalError::Invalid(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for WalError {}

pub(super) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> WalError {
    let what = what.into();
    move |e| WalError::Io(what, e)
}

/// Health of the log's disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiskState {
    /// Flushing normally.
    Healthy,
    /// A flush has taken longer than `disk_stall_ms`.
    Degraded,
    /// No space for the next segment; new appends are refused.
    Full,
    /// A write or fdatasync failed; the group stops on this node.
    Failed(String),
}

/// What `open` found.
#[derive(Debug)]
pub struct OpenReport {
    /// What the consensus core restarts from (with `repair_until` set when
    /// unrepaired corruption was found).
    pub restored: RestoredState,
    /// The torn tail discarded, if any.
    pub torn_tail: Option<TornTail>,
    /// Corruption found in the middle of the log.
    pub corruption: Vec<Corruption>,
    /// Which I/O backend is active, and why.
    pub backend: String,
    /// Whether O_DIRECT is in use, and why (not).
    pub direct_io: String,
    /// Segment files scanned.
    pub segments: usize,
    /// Bytes scanned.
    pub bytes_scanned: u64,
    /// Time recovery took.
    pub elapsed: Duration,
}

impl std::fmt::Display for OpenReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let last = self.restored.entries.last().map_or(0, |e| e.index);
        write!(
            f,
            "recovered {} entries (to index {last}, commit {}) from {} segments, {} MiB scanned in {:.1} ms; {}; {}",
            self.restored.entries.len(),
            self.restored.hard_state.commit,
            self.segments,
            self.bytes_scanned >> 20,
            self.elapsed.as_secs_f64() * 1e3,
            self.backend,
            self.direct_io
        )?;
        if let Some(t) = &self.torn_tail {
            write!(
                f,
                "; discarded a torn tail at segment {} offset {} ({}, {} unacknowledged batches)",
                t.segment, t.offset, t.reason, t.batches_discarded
            )?;
        }
        for c in &self.corruption {
            write!(
                f,
                "; CORRUPTION at segment {} offset {} ({}): entries {}..={} {}",
                c.segment,
                c.offset,
                c.reason,
                c.lost.0,
                c.lost.1,
                if c.healed {
                    "were rewritten later"
                } else {
                    "must be fetched from a peer"
                }
            )?;
        }
        Ok(())
    }
}

/// Per-disk metrics.
pub struct WalMetrics {
    /// Latency of each flush (write + fdatasync), µs.
    pub flush_latency_us: Histogram<u64>,
    /// Records per flush.
    pub records_per_flush: Histogram<u64>,
    /// Bytes per flush.
    pub bytes_per_flush: Histogram<u64>,
    /// Flushes completed.
    pub flushes: u64,
    /// Records made durable.
    pub records: u64,
    /// Bytes written, padding included.
    pub bytes: u64,
    /// Flushes that took longer than `disk_stall_ms`.
    pub stalls: u64,
    /// Write or sync errors.
    pub io_errors: u64,
    /// Appends refused because the disk was full.
    pub disk_full_refusals: u64,
    /// Segments zero-filled, counted when started (each costs a segment's
    /// worth of writes).
    pub segments_zero_filled: u64,
    /// Trimmed segments kept for reuse instead of a zero-fill.
    pub segments_recycled: u64,
    /// Batches read back from the segments by cold reads (entries below
    /// the snapshot that ledgers and queues refer to), counted when done.
    pub cold_reads: u64,
    /// Cold reads that failed (an I/O error, or a batch that no longer
    /// holds what was located): the request that wanted it gets an error;
    /// the log goes on.
    pub cold_read_errors: u64,
    /// Entries stored as repaired copies since open
    /// ([`Wal::store_repaired`](super::Wal::store_repaired)).
    pub entries_repaired: u64,
}

impl WalMetrics {
    pub(super) fn new() -> Self {
        let h = || Histogram::new(3).expect("3 significant figures is valid");
        WalMetrics {
            flush_latency_us: h(),
            records_per_flush: h(),
            bytes_per_flush: h(),
            flushes: 0,
            records: 0,
            bytes: 0,
            stalls: 0,
            io_errors: 0,
            disk_full_refusals: 0,
            segments_zero_filled: 0,
            segments_recycled: 0,
            cold_reads: 0,
            cold_read_errors: 0,
            entries_repaired: 0,
        }
    }
}

/// [`Wal::entry_bytes_max`] of a log configured with `cfg`.
pub fn entry_bytes_max(cfg: &WalConfig) -> usize {
    let half_segment = usize::try_from(cfg.segment_bytes / 2).unwrap_or(usize::MAX);
    half_segment.min(crate::storage::format::ENTRY_PAYLOAD_MAX)
}

pub(super) fn is_enospc(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::small_cfg;
    use super::super::Wal;
    use super::*;

    #[test]
    fn a_segment_that_cannot_hold_two_flushes_or_whole_blocks_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for segment_bytes in [16 << 10, (64 << 10) + 512] {
            let cfg = WalConfig {
                segment_bytes,
                ..small_cfg()
            };
            let Err(err) = Wal::open(dir.path(), cfg) else {
                panic!("refused")
            };
            assert!(
                matches!(&err, WalError::Invalid(m) if m.contains("segment_bytes")),
                "{err}"
            );
        }
    }

    #[test]
    fn an_entry_may_take_half_a_segment_up_to_the_format_limit() {
        assert_eq!(entry_bytes_max(&small_cfg()), 32 << 10);
        let huge = WalConfig {
            segment_bytes: 1 << 40,
            ..small_cfg()
        };
        assert_eq!(
            entry_bytes_max(&huge),
            crate::storage::format::ENTRY_PAYLOAD_MAX
        );
    }

    #[test]
    fn the_report_names_a_torn_tail_and_corruption_with_where_they_are() {
        use crate::storage::format::FormatError;
        let mut report = OpenReport {
            restored: RestoredState::default(),
            torn_tail: None,
            corruption: vec![Corruption {
                segment: 3,
                offset: 8192,
                reason: FormatError::BadChecksum,
                lost: (10, 19),
                healed: false,
            }],
            backend: "portable".into(),
            direct_io: "buffered".into(),
            segments: 4,
            bytes_scanned: 4 << 20,
            elapsed: Duration::from_millis(3),
        };
        let text = report.to_string();
        assert!(
            text.contains("CORRUPTION at segment 3 offset 8192"),
            "{text}"
        );
        assert!(
            text.contains("entries 10..=19 must be fetched from a peer"),
            "{text}"
        );
        report.corruption[0].healed = true;
        assert!(report.to_string().contains("were rewritten later"));
        assert!(is_enospc(&io::Error::from_raw_os_error(libc::ENOSPC)));
        assert!(!is_enospc(&io::Error::from_raw_os_error(libc::EIO)));
    }
}
