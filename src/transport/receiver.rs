//! The receiving half of one channel: gap detection, the NACK schedule,
//! the hold-back buffer, in-order delivery, skipping what the sender no
//! longer has, and reassembly of fragmented messages.
//!
//! `slots[i]` stands for seq `next_deliver + i`; `slots[0]` is never
//! present (it would have been delivered). A missing slot carries the time
//! it may next be requested: first after the reorder window (a frame that
//! is merely late fills it without a request), then, while it stays
//! missing, an RTO or `nack_interval_ms` after each request. First
//! requests and repeats are tracked apart because the endpoint limits
//! them apart: repeats per peer per `nack_interval_ms`, first requests
//! only by their reorder window. Everything is bounded: slots by
//! `holdback_frames_max`, held payload by `holdback_bytes_max`, a message
//! being reassembled by `message_bytes_max`.
//!
//! No I/O and no clock: the endpoint passes in the time and a random delay.

use super::config::TransportConfig;
use super::stats::ChannelStats;
use std::borrow::Cow;
use std::collections::VecDeque;

/// One position of the hold-back window.
enum Slot {
    /// Known to exist, not received: request it at `due_us`.
    Missing {
        /// When this seq may next be requested.
        due_us: u64,
        /// Times it was requested.
        nacks: u32,
    },
    /// Received out of order, waiting for the gap before it.
    Present {
        payload: Vec<u8>,
        frag_index: u16,
        frag_count: u16,
    },
}

/// A message being reassembled from in-order fragments.
struct Partial {
    first_seq: u64,
    count: u16,
    next_index: u16,
    buf: Vec<u8>,
}

/// Spare message buffers kept at most, and their capacity at most in
/// bytes: enough for the messages one driver turn completes (a turn reads
/// several `recvmmsg` batches of up to 32 GRO messages of 64 KiB; with 16
/// and 4 MiB the pool ran dry within a turn and the faults came back,
/// 745 against 899 MiB/s at MTU 9000). Bounded: 8 MiB per endpoint.
const SPARE_BUFFERS_MAX: usize = 128;
const SPARE_BYTES_MAX: usize = 8 << 20;

/// Buffers of delivered messages the caller gave back
/// (`Endpoint::recycle_message`), which reassembly reuses. A 64 KiB
/// message allocated and freed per delivery made glibc hand the pages
/// back to the kernel (a thread's arena trims above 128 KiB free) and
/// fault fresh zeroed ones in for the next: with 64 KiB messages at MTU
/// 9000 that was a third of the receiver's time in perf, and reusing the
/// buffers doubled quire-bench's udp goodput.
#[derive(Default)]
pub(super) struct SpareBuffers {
    bufs: Vec<Vec<u8>>,
    /// Sum of the kept buffers' capacities.
    bytes: usize,
}

impl SpareBuffers {
    /// Keeps `buf` for a later message, if the bounds allow.
    pub(super) fn give(&mut self, mut buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap == 0 || self.bufs.len() >= SPARE_BUFFERS_MAX || self.bytes + cap > SPARE_BYTES_MAX {
            return;
        }
        buf.clear();
        self.bytes += cap;
        self.bufs.push(buf);
    }

    /// An empty buffer with room for `bytes`: a spare one when there is one.
    fn take(&mut self, bytes: usize) -> Vec<u8> {
        match self.bufs.pop() {
            Some(mut buf) => {
                self.bytes -= buf.capacity();
                buf.reserve_exact(bytes);
                buf
            }
            None => Vec::with_capacity(bytes),
        }
    }

    /// Buffers kept, and their capacity in bytes.
    #[cfg(test)]
    pub(super) fn kept(&self) -> (usize, usize) {
        (self.bufs.len(), self.bytes)
    }
}

/// What the receiving half hands to the endpoint, in seq order.
pub(super) enum RxItem {
    /// A complete message.
    Message(Vec<u8>),
    /// Seqs `first..=last` will never be delivered.
    Skipped { first: u64, last: u64 },
}

/// The receiving half of a channel.
pub(super) struct RxHalf {
    /// Next seq to deliver; everything below was delivered or skipped.
    pub(super) next_deliver: u64,
    slots: VecDeque<Slot>,
    /// Payload bytes in present slots.
    pub(super) holdback_bytes: usize,
    /// Present slots.
    pub(super) holdback_frames: usize,
    partial: Option<Partial>,
    /// The head of the current message was skipped: drop its remaining
    /// fragments until the next first fragment.
    orphaned: bool,
    /// `next_deliver` as last acknowledged to the peer (0: never).
    ack_sent: u64,
    /// An ack should go out: at `ack_due_us`, or earlier with other traffic.
    pub(super) ack_pending: bool,
    /// An ack should go out in the next datagram.
    pub(super) ack_now: bool,
    /// Latest time the pending ack may wait until.
    pub(super) ack_due_us: Option<u64>,
    bytes_since_ack: usize,
    /// Earliest `due_us` of a missing slot never requested (may be
    /// early, never late).
    pub(super) first_nack_due_us: Option<u64>,
    /// Earliest `due_us` of a missing slot requested before (may be
    /// early, never late).
    pub(super) repeat_nack_due_us: Option<u64>,
}

impl RxHalf {
    pub(super) fn new() -> Self {
        RxHalf {
            next_deliver: 1,
            slots: VecDeque::new(),
            holdback_bytes: 0,
            holdback_frames: 0,
            partial: None,
            orphaned: false,
            ack_sent: 0,
            ack_pending: false,
            ack_now: false,
            ack_due_us: None,
            bytes_since_ack: 0,
            first_nack_due_us: None,
            repeat_nack_due_us: None,
        }
    }

    /// Highest seq known to exist plus one.
    fn known_end(&self) -> u64 {
        self.next_deliver + self.slots.len() as u64
    }

    fn want_ack(&mut self, cfg: &TransportConfig, now_us: u64) {
        self.ack_pending = true;
        self.ack_due_us.get_or_insert(now_us + cfg.ack_delay_us);
    }

    /// An ack frame carrying `next_deliver` was written.
    pub(super) fn ack_written(&mut self) {
        self.ack_sent = self.next_deliver;
        self.ack_pending = false;
        self.ack_now = false;
        self.ack_due_us = None;
        self.bytes_since_ack = 0;
    }

    /// Marks seqs `known_end()..end` missing, requestable after `delay_us`;
    /// never beyond the hold-back window.
    fn extend_missing(&mut self, cfg: &TransportConfig, now_us: u64, delay_us: u64, end: u64) {
        let limit = self.next_deliver + cfg.holdback_frames_max as u64;
        let end = end.min(limit);
        if end <= self.known_end() {
            return;
        }
        let due_us = now_us + delay_us;
        while self.known_end() < end {
            self.slots.push_back(Slot::Missing { due_us, nacks: 0 });
        }
        self.first_nack_due_us = Some(self.first_nack_due_us.map_or(due_us, |d| d.min(due_us)));
    }

    /// A DATA frame. `delay_us` is the random wait before a gap this frame
    /// reveals may be requested.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_data(
        &mut self,
        cfg: &TransportConfig,
        now_us: u64,
        delay_us: u64,
        seq: u64,
        frag_index: u16,
        frag_count: u16,
        payload: &[u8],
        out: &mut Vec<RxItem>,
        spare: &mut SpareBuffers,
        stats: &mut ChannelStats,
    ) {
        if seq < self.next_deliver {
            stats.duplicates_dropped += 1;
            // The sender sent it again: our ack may have been lost.
            self.want_ack(cfg, now_us);
            return;
        }
        let off = seq - self.next_deliver;
        if off >= cfg.holdback_frames_max as u64 {
            stats.holdback_dropped += 1;
            return;
        }
        let off = off as usize;
        if off == 0 {
            if let Some(Slot::Missing { nacks, .. }) = self.slots.pop_front() {
                if nacks > 0 {
                    stats.gaps_filled += 1;
                }
            }
            stats.frames_received += 1;
            self.next_deliver += 1;
            // In order: the fragment is copied once, straight into its
            // message (or into a message of its own), never held alone.
            self.reassemble(
                cfg,
                seq,
                frag_index,
                frag_count,
                Cow::Borrowed(payload),
                out,
                spare,
                stats,
            );
            self.drain(cfg, out, spare, stats);
        } else {
            // Everything between is missing, unless already known.
            self.extend_missing(cfg, now_us, delay_us, seq);
            if off == self.slots.len() {
                self.slots.push_back(Slot::Missing {
                    due_us: now_us + delay_us,
                    nacks: 0,
                });
            }
            match &self.slots[off] {
                Slot::Present { .. } => {
                    stats.duplicates_dropped += 1;
                    return;
                }
                Slot::Missing { nacks, .. } => {
                    if self.holdback_bytes + payload.len() > cfg.holdback_bytes_max {
                        stats.holdback_dropped += 1;
                        return;
                    }
                    if *nacks > 0 {
                        stats.gaps_filled += 1;
                    }
                }
            }
            stats.frames_received += 1;
            self.holdback_bytes += payload.len();
            self.holdback_frames += 1;
            self.slots[off] = Slot::Present {
                payload: payload.to_vec(),
                frag_index,
                frag_count,
            };
        }
        self.bytes_since_ack += payload.len();
        if self.next_deliver != self.ack_sent {
            self.want_ack(cfg, now_us);
            if self.bytes_since_ack >= cfg.ack_every_bytes {
                self.ack_now = true;
            }
        }
    }

    /// The peer's ACK frame told us how far it has sent (`send_next`,
    /// exclusive) and maybe asked for an ack at once (`probe`).
    pub(super) fn on_sender_state(
        &mut self,
        cfg: &TransportConfig,
        now_us: u64,
        delay_us: u64,
        send_next: u64,
        probe: bool,
    ) {
        self.extend_missing(cfg, now_us, delay_us, send_next);
        if probe {
            self.want_ack(cfg, now_us);
            self.ack_now = true;
        }
    }

    /// The sender holds nothing below `base`: deliver what we hold below
    /// it, report the rest skipped, and move on.
    pub(super) fn on_too_old(
        &mut self,
        cfg: &TransportConfig,
        now_us: u64,
        base: u64,
        out: &mut Vec<RxItem>,
        spare: &mut SpareBuffers,
        stats: &mut ChannelStats,
    ) {
        stats.too_old_received += 1;
        if base <= self.next_deliver {
            return;
        }
        let mut run: Option<u64> = None;
        while self.next_deliver < base {
            let seq = self.next_deliver;
            match self.slots.pop_front() {
                Some(Slot::Present {
                    payload,
                    frag_index,
                    frag_count,
                }) => {
                    if let Some(first) = run.take() {
                        self.skip(first, seq - 1, out, stats);
                    }
                    self.holdback_bytes -= payload.len();
                    self.holdback_frames -= 1;
                    self.next_deliver += 1;
                    self.reassemble(
                        cfg,
                        seq,
                        frag_index,
                        frag_count,
                        Cow::Owned(payload),
                        out,
                        spare,
                        stats,
                    );
                }
                Some(Slot::Missing { .. }) => {
                    run.get_or_insert(seq);
                    self.next_deliver += 1;
                }
                None => {
                    // Never seen at all: jump without walking.
                    run.get_or_insert(seq);
                    self.next_deliver = base;
                }
            }
        }
        if let Some(first) = run {
            self.skip(first, base - 1, out, stats);
        }
        self.drain(cfg, out, spare, stats);
        self.recompute_nack_due();
        self.want_ack(cfg, now_us);
    }

    fn skip(&mut self, first: u64, last: u64, out: &mut Vec<RxItem>, stats: &mut ChannelStats) {
        stats.gaps_skipped = stats.gaps_skipped.saturating_add(last - first + 1);
        if self.partial.take().is_some() {
            stats.reassembly_aborted += 1;
        }
        // Fragments after the gap belong to a message whose head may be
        // gone; drop them up to the next first fragment.
        self.orphaned = true;
        out.push(RxItem::Skipped { first, last });
    }

    /// Delivers present slots from the front.
    fn drain(
        &mut self,
        cfg: &TransportConfig,
        out: &mut Vec<RxItem>,
        spare: &mut SpareBuffers,
        stats: &mut ChannelStats,
    ) {
        while let Some(Slot::Present { .. }) = self.slots.front() {
            let Some(Slot::Present {
                payload,
                frag_index,
                frag_count,
            }) = self.slots.pop_front()
            else {
                unreachable!("front was present");
            };
            let seq = self.next_deliver;
            self.holdback_bytes -= payload.len();
            self.holdback_frames -= 1;
            self.next_deliver += 1;
            self.reassemble(
                cfg,
                seq,
                frag_index,
                frag_count,
                Cow::Owned(payload),
                out,
                spare,
                stats,
            );
        }
    }

    /// Feeds one in-order fragment to reassembly: borrowed when it comes
    /// straight from a datagram, owned when it was held back.
    #[allow(clippy::too_many_arguments)]
    fn reassemble(
        &mut self,
        cfg: &TransportConfig,
        seq: u64,
        frag_index: u16,
        frag_count: u16,
        payload: Cow<'_, [u8]>,
        out: &mut Vec<RxItem>,
        spare: &mut SpareBuffers,
        stats: &mut ChannelStats,
    ) {
        if let Some(p) = &mut self.partial {
            if frag_index == p.next_index && frag_count == p.count {
                if p.buf.len() + payload.len() > cfg.message_bytes_max {
                    let first = p.first_seq;
                    self.abort(first, seq, out, stats);
                    return;
                }
                p.buf.extend_from_slice(&payload);
                p.next_index += 1;
                if p.next_index == p.count {
                    let done = self.partial.take().map(|p| p.buf).unwrap_or_default();
                    self.deliver(done, out, stats);
                }
                return;
            }
            // The sender broke the fragment rules: drop the partial
            // message; this frame may start a new one.
            let first = p.first_seq;
            self.abort(first, seq - 1, out, stats);
        }
        if frag_index != 0 {
            if !self.orphaned {
                // A continuation with no head, not explained by a skip.
                stats.reassembly_aborted += 1;
                out.push(RxItem::Skipped {
                    first: seq,
                    last: seq,
                });
                self.orphaned = true;
            }
            return;
        }
        self.orphaned = false;
        if frag_count == 1 {
            self.deliver(payload.into_owned(), out, stats);
        } else if payload.len() > cfg.message_bytes_max {
            self.abort(seq, seq, out, stats);
        } else {
            // Every fragment but the last is as long as the first, so this
            // holds the whole message: growing the buffer fragment by
            // fragment instead cost a realloc, a copy of what was there
            // and fresh pages to fault in at each doubling (a fifth of the
            // receiver's time with 64 KiB messages at MTU 9000, in perf).
            // Bounded like the message itself; a buffer given back by
            // the caller when there is one.
            let whole_bytes = (payload.len() * frag_count as usize).min(cfg.message_bytes_max);
            let mut buf = spare.take(whole_bytes);
            buf.extend_from_slice(&payload);
            self.partial = Some(Partial {
                first_seq: seq,
                count: frag_count,
                next_index: 1,
                buf,
            });
        }
    }

    /// Drops a message being reassembled and reports its seqs skipped.
    fn abort(&mut self, first: u64, last: u64, out: &mut Vec<RxItem>, stats: &mut ChannelStats) {
        self.partial = None;
        self.orphaned = true;
        stats.reassembly_aborted += 1;
        out.push(RxItem::Skipped {
            first,
            last: last.max(first),
        });
    }

    fn deliver(&mut self, message: Vec<u8>, out: &mut Vec<RxItem>, stats: &mut ChannelStats) {
        stats.messages_delivered += 1;
        stats.message_bytes_delivered += message.len() as u64;
        out.push(RxItem::Message(message));
    }

    fn recompute_nack_due(&mut self) {
        let (mut first, mut repeat): (Option<u64>, Option<u64>) = (None, None);
        for slot in &self.slots {
            if let Slot::Missing { due_us, nacks } = slot {
                let d = if *nacks == 0 { &mut first } else { &mut repeat };
                *d = Some(d.map_or(*due_us, |x| x.min(*due_us)));
            }
        }
        self.first_nack_due_us = first;
        self.repeat_nack_due_us = repeat;
    }

    /// True if a NACK is due at `now_us`: a first request, or a repeat
    /// when `repeats` (the peer's rate limit) allows.
    pub(super) fn nack_due(&self, now_us: u64, repeats: bool) -> bool {
        self.first_nack_due_us.is_some_and(|d| d <= now_us)
            || (repeats && self.repeat_nack_due_us.is_some_and(|d| d <= now_us))
    }

    /// The missing seqs due for a request at `now_us`, as at most
    /// `ranges_max` ranges: those never requested, and with `repeats` also
    /// those requested before. Each is next due `repeat_us` later. Returns
    /// the ranges and whether any seq in them was a repeat.
    pub(super) fn collect_nack(
        &mut self,
        now_us: u64,
        repeats: bool,
        repeat_us: u64,
        ranges_max: usize,
        stats: &mut ChannelStats,
    ) -> (Vec<(u64, u32)>, bool) {
        let mut ranges: Vec<(u64, u32)> = Vec::new();
        let mut repeated = false;
        let mut open = false;
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let seq = self.next_deliver + i as u64;
            match slot {
                Slot::Missing { due_us, nacks }
                    if *due_us <= now_us && (repeats || *nacks == 0) =>
                {
                    let extend = open && ranges.last().is_some_and(|r| r.1 < u32::MAX);
                    if extend {
                        if let Some(r) = ranges.last_mut() {
                            r.1 += 1;
                        }
                    } else if ranges.len() < ranges_max {
                        ranges.push((seq, 1));
                    } else {
                        open = false;
                        continue;
                    }
                    open = true;
                    *due_us = now_us + repeat_us;
                    if *nacks > 0 {
                        repeated = true;
                        stats.nack_seqs_repeated += 1;
                    }
                    *nacks = nacks.saturating_add(1);
                    stats.nack_seqs_requested += 1;
                }
                _ => open = false,
            }
        }
        self.recompute_nack_due();
        (ranges, repeated)
    }

    /// Forgets everything: the peer restarted.
    pub(super) fn reset(&mut self) {
        *self = RxHalf::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_buffers_are_bounded_in_count_and_bytes() {
        let mut spare = SpareBuffers::default();
        for _ in 0..2 * SPARE_BUFFERS_MAX {
            spare.give(Vec::with_capacity(1024));
        }
        assert_eq!(spare.kept().0, SPARE_BUFFERS_MAX);
        let mut spare = SpareBuffers::default();
        for _ in 0..8 {
            spare.give(Vec::with_capacity(SPARE_BYTES_MAX / 2));
        }
        assert_eq!(spare.kept(), (2, SPARE_BYTES_MAX));
        // Taking one gives its bytes back to the bound, emptied.
        let buf = spare.take(10);
        assert!(buf.is_empty() && buf.capacity() >= SPARE_BYTES_MAX / 2);
        assert_eq!(spare.kept(), (1, SPARE_BYTES_MAX / 2));
    }

    #[test]
    fn a_given_back_buffer_comes_back_empty() {
        let mut spare = SpareBuffers::default();
        spare.give(vec![7u8; 4096]);
        let buf = spare.take(100);
        assert!(buf.is_empty());
        assert!(buf.capacity() >= 4096);
        assert_eq!(spare.kept(), (0, 0));
    }
}
