//! The sending half of one channel: sequence numbers, the flow-control
//! window, the frames kept for retransmission, and the answers to NACKs.
//!
//! Positions, all seqs, with `hist_base >= acked` and frames contiguous:
//!
//! ```text
//!   1 .. acked          acknowledged by the peer, gone
//!   acked .. hist_base  unacknowledged but evicted (the history was full)
//!   hist_base .. next   in `history`; below `first_unsent` sent at least once
//! ```
//!
//! No I/O and no clock: the endpoint passes the time in and builds the
//! datagrams from what this half says to send.

use super::config::TransportConfig;
use super::message::OutMessage;
use super::stats::ChannelStats;
use super::wire::{DataFields, NackRanges, SEQ_MAX};
use super::GroupId;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

/// One frame kept for retransmission.
pub(super) struct HistFrame {
    /// The message the fragment is cut from, shared by all its fragments
    /// (allocated per message, not per fragment; its large payloads are
    /// the log's, not copies).
    message: Arc<OutMessage>,
    /// Where the fragment's bytes are in `message`.
    start: usize,
    len: usize,
    /// Position in its message.
    pub(super) frag_index: u16,
    /// Fragments in its message.
    pub(super) frag_count: u16,
    /// When it was last retransmitted; `None` before the first time. The
    /// first transmission does not count: `rexmit_min_interval_ms` spaces
    /// retransmissions, and a receiver whose reorder window (a fraction of
    /// an RTT) has passed must get its first request answered at once.
    pub(super) last_rexmit_us: Option<u64>,
    /// Endpoint-wide insertion order, for oldest-first eviction.
    pub(super) stamp: u64,
}

impl HistFrame {
    /// The fragment's bytes, as slices of its message's pieces.
    pub(super) fn payload(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.message.slices(self.start..self.start + self.len)
    }

    /// Its DATA frame's fields, as seq `seq` of `group`.
    pub(super) fn fields(&self, group: GroupId, seq: u64, rexmit: bool) -> DataFields {
        DataFields {
            group,
            seq,
            rexmit,
            frag_index: self.frag_index,
            frag_count: self.frag_count,
        }
    }

    /// The fragment's length in bytes.
    pub(super) fn len(&self) -> usize {
        self.len
    }
}

/// What answering the NACKs of one datagram may still cost.
pub(super) struct NackBudget {
    /// Frames that may still be queued for retransmission.
    pub(super) rexmit_left: usize,
    /// Seqs that may still be examined.
    pub(super) scan_left: usize,
}

/// Highest probe back-off: the interval doubles up to 2^6 times.
const PROBE_BACKOFF_MAX: u32 = 6;

/// The sending half of a channel.
pub(super) struct TxHalf {
    /// Next seq to assign.
    pub(super) next_seq: u64,
    /// Every seq below is acknowledged.
    pub(super) acked: u64,
    /// Every seq below has been transmitted once (or was evicted first).
    pub(super) first_unsent: u64,
    /// Seq of `history[0]`.
    pub(super) hist_base: u64,
    /// Frames `hist_base..next_seq`.
    pub(super) history: VecDeque<HistFrame>,
    /// Payload bytes of each frame `acked..next_seq`, for the window (the
    /// history may have evicted some of them).
    inflight_sizes: VecDeque<u32>,
    /// Sum of `inflight_sizes`.
    pub(super) inflight_bytes: usize,
    /// `send` was refused since the window last opened.
    pub(super) stalled: bool,
    /// When to probe for a lost tail, while data is unacknowledged.
    pub(super) probe_due_us: Option<u64>,
    /// Unanswered probes in a row (the interval doubles with each).
    probe_backoff: u32,
    /// A probe is due in the next datagram to the peer.
    pub(super) probe_now: bool,
    /// A TOO_OLD answer with this base is due.
    pub(super) too_old: Option<u64>,
    /// Buffers of messages whose every fragment left the history, for the
    /// next messages (freeing and allocating 64 KiB per message gave pages
    /// back to the kernel and faulted them in again). At most
    /// [`SPARE_MESSAGES_MAX`] of at most [`SPARE_MESSAGE_BYTES_MAX`] each.
    spare: Vec<Vec<u8>>,
}

/// Message buffers kept per channel for reuse.
const SPARE_MESSAGES_MAX: usize = 8;
/// Largest message buffer kept for reuse.
const SPARE_MESSAGE_BYTES_MAX: usize = 256 << 10;

impl TxHalf {
    pub(super) fn new() -> Self {
        TxHalf {
            next_seq: 1,
            acked: 1,
            first_unsent: 1,
            hist_base: 1,
            history: VecDeque::new(),
            inflight_sizes: VecDeque::new(),
            inflight_bytes: 0,
            stalled: false,
            probe_due_us: None,
            probe_backoff: 0,
            probe_now: false,
            too_old: None,
            spare: Vec::new(),
        }
    }

    /// Frames sent and not acknowledged.
    pub(super) fn inflight_frames(&self) -> usize {
        self.inflight_sizes.len()
    }

    /// True if a message of `len` bytes in `frags` fragments fits the window.
    pub(super) fn window_admits(&self, cfg: &TransportConfig, len: usize, frags: usize) -> bool {
        self.inflight_bytes + len <= cfg.window_bytes
            && self.inflight_frames() + frags <= cfg.window_frames_max
    }

    /// True once a stalled window is at most half full again (hysteresis,
    /// so the caller is not woken for every freed byte).
    fn window_reopened(&self, cfg: &TransportConfig) -> bool {
        self.inflight_bytes <= cfg.window_bytes / 2
            && self.inflight_frames() <= cfg.window_frames_max / 2
    }

    /// An empty buffer of a message that left the history with room for
    /// `bytes`, if one is kept (a smaller one stays for a smaller message).
    pub(super) fn spare_buffer(&mut self, bytes: usize) -> Option<Vec<u8>> {
        let i = self.spare.iter().rposition(|b| b.capacity() >= bytes)?;
        let mut buf = self.spare.swap_remove(i);
        buf.clear();
        Some(buf)
    }

    /// Appends one frame, the bytes `fragment` of `message`, to the
    /// history; returns its seq.
    pub(super) fn push(
        &mut self,
        message: &Arc<OutMessage>,
        fragment: Range<usize>,
        frag_index: u16,
        frag_count: u16,
        stamp: u64,
    ) -> u64 {
        let seq = self.next_seq;
        assert!(seq < SEQ_MAX, "channel sequence space exhausted");
        assert!(fragment.start <= fragment.end && fragment.end <= message.len());
        let len = fragment.len();
        self.inflight_sizes.push_back(len as u32);
        self.inflight_bytes += len;
        self.history.push_back(HistFrame {
            message: message.clone(),
            start: fragment.start,
            len,
            frag_index,
            frag_count,
            last_rexmit_us: None,
            stamp,
        });
        self.next_seq += 1;
        debug_assert_eq!(self.hist_base + self.history.len() as u64, self.next_seq);
        seq
    }

    /// The frame with `seq`, if the history holds it.
    pub(super) fn frame_mut(&mut self, seq: u64) -> Option<&mut HistFrame> {
        let off = seq.checked_sub(self.hist_base)?;
        self.history.get_mut(usize::try_from(off).ok()?)
    }

    /// Drops the oldest frame of the history; returns its payload bytes.
    pub(super) fn evict_front(&mut self) -> Option<usize> {
        let f = self.history.pop_front()?;
        self.hist_base += 1;
        let len = f.len;
        // The last fragment of its message to go: keep the buffer.
        if let Ok(m) = Arc::try_unwrap(f.message) {
            self.keep_spare(m.into_buffer());
        }
        Some(len)
    }

    /// Keeps `buf` for a later message, within the spares' bounds.
    pub(super) fn keep_spare(&mut self, buf: Vec<u8>) {
        if self.spare.len() < SPARE_MESSAGES_MAX && buf.capacity() <= SPARE_MESSAGE_BYTES_MAX {
            self.spare.push(buf);
        }
    }

    /// Seq the receiver may learn we have sent up to (exclusive).
    pub(super) fn send_next(&self) -> u64 {
        self.first_unsent.max(self.acked)
    }

    /// A frame went out for the first time. `probe_us`, here and below:
    /// the probe interval for this peer (`probe_interval_ms`, or the RTO
    /// plus the ack delay if longer).
    pub(super) fn sent_first(&mut self, probe_us: u64, now_us: u64) {
        self.first_unsent += 1;
        self.probe_backoff = 0;
        self.probe_due_us = Some(now_us + probe_us);
    }

    /// The probe timer fired: ask for an ack, and back off.
    pub(super) fn probe_fired(&mut self, probe_us: u64, now_us: u64) {
        self.probe_now = true;
        self.probe_backoff = (self.probe_backoff + 1).min(PROBE_BACKOFF_MAX);
        self.probe_due_us = Some(now_us + (probe_us << self.probe_backoff));
    }

    /// A cumulative ack: every seq below `recv_next` arrived. Returns the
    /// (frames, payload bytes) freed from the history and whether a
    /// stalled window reopened.
    pub(super) fn on_ack(
        &mut self,
        cfg: &TransportConfig,
        probe_us: u64,
        now_us: u64,
        recv_next: u64,
    ) -> (usize, usize, bool) {
        if recv_next <= self.acked || recv_next > self.next_seq {
            // Old (reordered, replayed) or impossible: nothing to learn.
            return (0, 0, false);
        }
        while self.acked < recv_next {
            let size = self.inflight_sizes.pop_front().unwrap_or(0);
            self.inflight_bytes -= size as usize;
            self.acked += 1;
        }
        let (mut frames, mut bytes) = (0, 0);
        while self.hist_base < self.acked {
            match self.evict_front() {
                Some(len) => {
                    frames += 1;
                    bytes += len;
                }
                None => {
                    self.hist_base = self.acked;
                    break;
                }
            }
        }
        self.first_unsent = self.first_unsent.max(self.acked);
        self.probe_backoff = 0;
        self.probe_due_us = if self.acked == self.next_seq {
            None
        } else {
            Some(now_us + probe_us)
        };
        let reopened = self.stalled && self.window_reopened(cfg);
        if reopened {
            self.stalled = false;
        }
        (frames, bytes, reopened)
    }

    /// A NACK: queues in `out` the seqs to retransmit, within `budget`
    /// (shared by the whole datagram) and each at most once per
    /// `rexmit_min_interval_ms`; notes a TOO_OLD answer for seqs the
    /// history no longer holds.
    pub(super) fn on_nack(
        &mut self,
        cfg: &TransportConfig,
        now_us: u64,
        ranges: NackRanges<'_>,
        budget: &mut NackBudget,
        out: &mut Vec<u64>,
        stats: &mut ChannelStats,
    ) {
        let min_gap_us = cfg.rexmit_min_interval_ms * 1000;
        for (first, len) in ranges.iter() {
            // The decoder guarantees first >= 1, len >= 1, no overflow.
            let last = first + (len as u64 - 1);
            if first < self.hist_base {
                self.too_old = Some(self.too_old.unwrap_or(0).max(self.hist_base));
            }
            let lo = first.max(self.hist_base);
            // Never "retransmit" a frame that has not gone out once: it is
            // about to anyway.
            let hi = last.min(self.first_unsent.saturating_sub(1));
            let mut seq = lo;
            while seq <= hi {
                if budget.scan_left == 0 {
                    return;
                }
                budget.scan_left -= 1;
                if budget.rexmit_left == 0 {
                    stats.rexmit_suppressed += 1;
                    seq += 1;
                    continue;
                }
                let Some(frame) = self.frame_mut(seq) else {
                    break;
                };
                let due = frame
                    .last_rexmit_us
                    .is_none_or(|t| now_us >= t + min_gap_us);
                if due {
                    frame.last_rexmit_us = Some(now_us);
                    out.push(seq);
                    budget.rexmit_left -= 1;
                } else {
                    stats.rexmit_suppressed += 1;
                }
                seq += 1;
            }
        }
    }

    /// Forgets everything: the peer restarted. Returns the (frames, bytes)
    /// freed from the history and whether the window was stalled.
    pub(super) fn reset(&mut self) -> (usize, usize, bool) {
        let frames = self.history.len();
        let bytes = self.history.iter().map(|f| f.len).sum();
        let stalled = self.stalled;
        *self = TxHalf::new();
        (frames, bytes, stalled)
    }
}
