//! The endpoint-wide budget of the retransmission history: payload bytes
//! held by every channel together, and the order they came in, so that
//! when the budget (`history_bytes_max`) is exceeded the oldest frame of
//! the whole endpoint goes first, whichever channel holds it.
//!
//! Each channel keeps its own frames (contiguous by seq, oldest first);
//! this ledger keeps only (stamp, channel) in insertion order. Acks free
//! frames without touching the ledger, so entries go stale; an entry is
//! live exactly when its stamp is at least the stamp of its channel's
//! oldest frame (frames leave a channel oldest first, and a reset channel
//! restarts with larger stamps). Stale entries are skipped when popped and
//! swept when they outnumber live ones, so the ledger stays O(live frames).

use std::collections::VecDeque;

/// Stale entries tolerated beyond twice the live ones before a sweep.
const SWEEP_SLACK: usize = 1024;

/// Bytes and insertion order of the frames in every channel's history.
pub(super) struct HistoryLedger {
    order: VecDeque<(u64, usize)>,
    next_stamp: u64,
    /// Payload bytes held.
    pub(super) bytes: usize,
    /// Frames held.
    pub(super) frames: usize,
}

impl HistoryLedger {
    pub(super) fn new() -> Self {
        HistoryLedger {
            order: VecDeque::new(),
            next_stamp: 0,
            bytes: 0,
            frames: 0,
        }
    }

    /// Records a new frame of `len` bytes in channel `chan`; returns its stamp.
    pub(super) fn add(&mut self, chan: usize, len: usize) -> u64 {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.order.push_back((stamp, chan));
        self.bytes += len;
        self.frames += 1;
        stamp
    }

    /// Frames left a channel (acknowledged, evicted or reset).
    pub(super) fn freed(&mut self, frames: usize, bytes: usize) {
        self.frames -= frames;
        self.bytes -= bytes;
    }

    /// The oldest entry, live or stale: (stamp, channel).
    pub(super) fn pop_oldest(&mut self) -> Option<(u64, usize)> {
        self.order.pop_front()
    }

    /// True if stale entries should be swept now.
    pub(super) fn needs_sweep(&self) -> bool {
        self.order.len() > 2 * self.frames + SWEEP_SLACK
    }

    /// Keeps only entries for which `live(stamp, channel)` holds.
    pub(super) fn sweep(&mut self, mut live: impl FnMut(u64, usize) -> bool) {
        self.order.retain(|&(stamp, chan)| live(stamp, chan));
        debug_assert_eq!(self.order.len(), self.frames);
    }
}
