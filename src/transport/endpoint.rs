//! The protocol core: one [`Endpoint`] per event-loop thread, holding a
//! channel per (peer, group). It turns `send` calls and received datagrams
//! into datagrams to transmit and events to deliver.
//!
//! No I/O, no clock, no global randomness: the caller passes the time
//! (`now_us`, any monotonic microsecond clock), the endpoint draws its
//! session epoch and NACK delays from the seed it was given, and every
//! datagram leaves through [`Endpoint::poll_transmit`].

use super::config::{ConfigError, TransportConfig};
use super::events::{DropReason, Event, SendError, Transmit};
use super::history::HistoryLedger;
use super::mac::{ClusterKey, MAC_BYTES};
use super::message::OutMessage;
use super::peer::{Addressed, EpochCheck, EpochLimits, Peer};
use super::receiver::{RxHalf, RxItem, SpareBuffers};
use super::sender::{NackBudget, TxHalf};
use super::stats::{ChannelState, ChannelStats, EndpointStats, PeerStats};
use super::wire::{self, DatagramWriter, DecodeError, Frame, Header};
use super::GroupId;
use crate::consensus::NodeId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, VecDeque};
use std::ops::RangeInclusive;

/// Frames examined per received datagram when answering NACKs, as a
/// multiple of `rexmit_batch_max`: bounds the work a NACK can cause.
const NACK_SCAN_PER_BATCH: usize = 8;
/// Retransmissions that may wait per peer, as a multiple of
/// `rexmit_batch_max`.
const REXMIT_QUEUE_PER_BATCH: usize = 4;

/// One channel: both directions of (peer, group).
struct Channel {
    peer: usize,
    group: GroupId,
    tx: TxHalf,
    rx: RxHalf,
    stats: ChannelStats,
}

#[derive(Clone, Copy)]
enum Limit {
    Peers,
    Channels,
}

/// The transport protocol of one thread. See the module documentation of
/// [`crate::transport`] for the protocol and the calling contract.
pub struct Endpoint {
    cfg: TransportConfig,
    key: ClusterKey,
    local: NodeId,
    epoch: u64,
    rng: ChaCha8Rng,
    peers: Vec<Peer>,
    peer_index: BTreeMap<NodeId, usize>,
    channels: Vec<Channel>,
    channel_index: BTreeMap<(NodeId, GroupId), usize>,
    ledger: HistoryLedger,
    events: VecDeque<Event>,
    /// Message bytes in `events`.
    events_bytes: usize,
    stats: EndpointStats,
    /// Round-robin position among peers in `poll_transmit`.
    peer_cursor: usize,
    /// The latest time any call passed in; `send` takes no time of its own.
    now_us: u64,
    /// Scratch buffers reused across calls.
    items: Vec<RxItem>,
    seqs: Vec<u64>,
    /// Delivered messages' buffers given back, for reassembly to reuse.
    spare: SpareBuffers,
    /// Scratch: the MACs of a batch of datagrams.
    tags: Vec<[u8; MAC_BYTES]>,
}

impl Endpoint {
    /// An endpoint for node `local`. `seed` chooses the session epoch and
    /// every random delay; give each start of the process a fresh seed
    /// (from the OS in the daemon, from the run's seed in the simulator).
    pub fn new(
        cfg: TransportConfig,
        key: ClusterKey,
        local: NodeId,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        cfg.validate()?;
        if local == 0 {
            return Err(ConfigError("node id 0 is reserved".into()));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let epoch = loop {
            let e: u64 = rng.gen();
            if e != 0 {
                break e;
            }
        };
        Ok(Endpoint {
            cfg,
            key,
            local,
            epoch,
            rng,
            peers: Vec::new(),
            peer_index: BTreeMap::new(),
            channels: Vec::new(),
            channel_index: BTreeMap::new(),
            ledger: HistoryLedger::new(),
            events: VecDeque::new(),
            events_bytes: 0,
            stats: EndpointStats::default(),
            peer_cursor: 0,
            now_us: 0,
            items: Vec::new(),
            seqs: Vec::new(),
            spare: SpareBuffers::default(),
            tags: Vec::new(),
        })
    }

    /// This node's id.
    pub fn local(&self) -> NodeId {
        self.local
    }

    /// This endpoint's session epoch (random, non-zero).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The configuration in force.
    pub fn config(&self) -> &TransportConfig {
        &self.cfg
    }

    /// Queues `message` for `group` on `peer`; returns the seqs it took.
    /// Call [`Endpoint::poll_transmit`] afterwards: messages queued before
    /// that call share datagrams. On [`SendError::WouldBlock`] stop sending
    /// on this channel until [`Event::Writable`].
    pub fn send(
        &mut self,
        peer: NodeId,
        group: GroupId,
        message: &[u8],
    ) -> Result<RangeInclusive<u64>, SendError> {
        let mut buf = self.message_buffer(peer, group, message.len());
        buf.extend_from_slice(message);
        self.send_buffer(peer, group, buf)
    }

    /// An empty buffer with room for `bytes`, to encode a message to
    /// `peer` in `group` into, for [`Endpoint::send_buffer`]: one of that
    /// channel's sent messages whose frames have all left the history,
    /// when it has one that large, so that buffers are reused rather than
    /// allocated (or grown, copying) per message.
    pub fn message_buffer(&mut self, peer: NodeId, group: GroupId, bytes: usize) -> Vec<u8> {
        self.channel_index
            .get(&(peer, group))
            .and_then(|&c| self.channels[c].tx.spare_buffer(bytes))
            .unwrap_or_else(|| Vec::with_capacity(bytes))
    }

    /// [`Endpoint::send`] of a message in the caller's buffer, which the
    /// history keeps as it is: the message is not copied. Refused as
    /// `send` refuses (the buffer is then reused or freed).
    pub fn send_buffer(
        &mut self,
        peer: NodeId,
        group: GroupId,
        message: Vec<u8>,
    ) -> Result<RangeInclusive<u64>, SendError> {
        self.send_message(peer, group, OutMessage::from_vec(message))
    }

    /// An empty message to `peer` in `group`, writing into one of that
    /// channel's spare buffers (see [`Endpoint::message_buffer`]), for
    /// [`Endpoint::send_message`].
    pub fn out_message(&mut self, peer: NodeId, group: GroupId, own_bytes: usize) -> OutMessage {
        OutMessage::with_buffer(self.message_buffer(peer, group, own_bytes))
    }

    /// [`Endpoint::send`] of a message of pieces, which the history keeps
    /// as it is: neither its own bytes nor the buffers it shares are
    /// copied until each fragment goes into its datagram. Refused as
    /// `send` refuses.
    pub fn send_message(
        &mut self,
        peer: NodeId,
        group: GroupId,
        message: OutMessage,
    ) -> Result<RangeInclusive<u64>, SendError> {
        if peer == 0 || peer == self.local {
            return Err(SendError::InvalidPeer);
        }
        if message.len() > self.cfg.message_bytes_max {
            return Err(SendError::TooLarge {
                len: message.len(),
                max: self.cfg.message_bytes_max,
            });
        }
        let c = self.channel_or_create(peer, group).map_err(|l| match l {
            Limit::Peers => SendError::TooManyPeers,
            Limit::Channels => SendError::TooManyChannels,
        })?;
        let frags = self.cfg.fragments(message.len());
        let frag_bytes = self.cfg.fragment_bytes_max();
        let ch = &mut self.channels[c];
        if !ch.tx.window_admits(&self.cfg, message.len(), frags) {
            ch.tx.stalled = true;
            ch.stats.window_stalls += 1;
            ch.tx.keep_spare(message.into_buffer());
            return Err(SendError::WouldBlock);
        }
        let first = ch.tx.next_seq;
        let len = message.len();
        let shared = std::sync::Arc::new(message);
        for i in 0..frags {
            let lo = i * frag_bytes;
            let hi = (lo + frag_bytes).min(len);
            let stamp = self.ledger.add(c, hi - lo);
            // frags <= 65535 is checked by config validation.
            ch.tx.push(&shared, lo..hi, i as u16, frags as u16, stamp);
        }
        ch.stats.messages_sent += 1;
        ch.stats.message_bytes_sent += len as u64;
        self.enforce_history_budget();
        Ok(first..=first + frags as u64 - 1)
    }

    /// Takes one datagram received from the network. Call it for every
    /// datagram, then drain [`Endpoint::poll_event`] and
    /// [`Endpoint::poll_transmit`]. A datagram that is dropped whole says
    /// why (log it); drops are also counted in the stats.
    pub fn handle_datagram(&mut self, now_us: u64, bytes: &[u8]) -> Result<(), DropReason> {
        self.handle_checked(now_us, bytes, None)
    }

    /// [`Endpoint::handle_datagram`] for each of `datagrams`, in order,
    /// with their MACs computed side by side first (several times faster
    /// per byte than one by one for datagrams of 1–2 KiB). Each one is
    /// authenticated exactly as `handle_datagram` would; `rejected` is
    /// called with the index and the reason of each one dropped whole.
    pub fn handle_datagrams(
        &mut self,
        now_us: u64,
        datagrams: &[&[u8]],
        mut rejected: impl FnMut(usize, DropReason),
    ) {
        let inputs: Vec<&[u8]> = datagrams.iter().map(|d| wire::mac_input(d)).collect();
        let mut tags = std::mem::take(&mut self.tags);
        self.key.tags(&inputs, &mut tags);
        for (i, (d, tag)) in datagrams.iter().zip(&tags).enumerate() {
            if let Err(why) = self.handle_checked(now_us, d, Some(tag)) {
                rejected(i, why);
            }
        }
        self.tags = tags;
    }

    /// `handle_datagram`, with the MAC of the datagram's body if a batch
    /// computed it.
    fn handle_checked(
        &mut self,
        now_us: u64,
        bytes: &[u8],
        tag: Option<&[u8; MAC_BYTES]>,
    ) -> Result<(), DropReason> {
        self.assert_indexes();
        let (events_before, peers_before) = (self.events.len(), self.peers.len());
        let r = self.receive(now_us, bytes, tag);
        if let Err(why) = &r {
            // A dropped datagram delivers nothing: what it carries is
            // unauthenticated, misaddressed or from a dead session, and
            // handing it to Raft could inject or replay a message.
            assert!(
                self.events
                    .iter()
                    .skip(events_before)
                    .all(|e| !matches!(e, Event::Delivered { .. } | Event::Skipped { .. })),
                "a dropped datagram ({why:?}) delivered a message"
            );
            if matches!(why, DropReason::Decode(_) | DropReason::Misaddressed) {
                // One that fails its MAC (or is not for us) changes nothing
                // at all: else a forger could restart sessions or use up
                // the peer slots that real peers need.
                assert_eq!(self.events.len(), events_before, "{why:?} queued an event");
                assert_eq!(self.peers.len(), peers_before, "{why:?} created a peer");
            }
        }
        self.assert_indexes();
        r
    }

    /// The id-to-slot maps agree with the slots: a map out of step would
    /// file one peer's frames under another's channel, delivering a
    /// message to the wrong peer or group.
    fn assert_indexes(&self) {
        assert_eq!(self.peer_index.len(), self.peers.len());
        assert_eq!(self.channel_index.len(), self.channels.len());
        assert!(self.peers.len() <= self.cfg.peers_max);
        assert!(self.channels.len() <= self.cfg.channels_max);
    }

    /// `handle_datagram` without its checks of the outcome.
    fn receive(
        &mut self,
        now_us: u64,
        bytes: &[u8],
        tag: Option<&[u8; MAC_BYTES]>,
    ) -> Result<(), DropReason> {
        self.now_us = self.now_us.max(now_us);
        self.stats.datagrams_received += 1;
        let decoded = match tag {
            Some(t) => wire::decode_with_tag(bytes, t),
            None => wire::decode(&self.key, bytes),
        };
        let datagram = match decoded {
            Ok(d) => d,
            Err(e) => {
                if e == DecodeError::BadMac {
                    self.stats.mac_failures += 1;
                } else {
                    self.stats.malformed_dropped += 1;
                }
                return Err(DropReason::Decode(e));
            }
        };
        let h = datagram.header;
        if h.receiver != self.local || h.sender == self.local {
            self.stats.misaddressed_dropped += 1;
            return Err(DropReason::Misaddressed);
        }
        let Ok(p) = self.peer_or_create(h.sender) else {
            self.stats.peers_over_limit_dropped += 1;
            return Err(DropReason::TooManyPeers);
        };
        let to = match h.peer_epoch {
            0 => Addressed::Unknown,
            e if e == self.epoch => Addressed::Us,
            _ => Addressed::Earlier,
        };
        let limits = EpochLimits {
            retired_max: self.cfg.retired_epochs_max,
            silence_us: self.cfg.epoch_silence_ms * 1000,
        };
        match self.peers[p].check_epoch(now_us, h.epoch, to, limits) {
            EpochCheck::Current | EpochCheck::First => {}
            EpochCheck::Restarted => self.peer_restarted(p),
            EpochCheck::Retired if self.peers[p].has_vouched() => {
                // The life we took knows us: this one is a dead life's.
                self.peers[p].stats.stale_epoch_dropped += 1;
                return Err(DropReason::StaleEpoch);
            }
            EpochCheck::Retired | EpochCheck::Unconfirmed => {
                // A dead life's straggler, or the live one that does not
                // know our epoch yet (a straggler may have taken its place
                // here before it vouched). Addressed to that life, our
                // announcement lets a live one vouch; addressed to a dead
                // one, it still reaches the peer's live life, which takes
                // our epoch from it and announces itself in turn.
                // Answering only the epoch we took would leave both ends
                // waiting for the other to vouch, for good.
                self.refuse_and_announce(p, now_us, h.epoch);
                return Err(DropReason::StaleEpoch);
            }
        }
        if to == Addressed::Earlier {
            // Meant for an earlier life of ours. Say who we are now, or a
            // peer that never hears from us would keep sending into the void.
            self.refuse_and_announce(p, now_us, h.epoch);
            return Err(DropReason::StaleEpoch);
        }
        let peer = &mut self.peers[p];
        peer.stats.datagrams_received += 1;
        peer.stats.bytes_received += bytes.len() as u64;
        peer.on_header(now_us, h.sent_us, h.echo);

        let mut budget = NackBudget {
            rexmit_left: self.cfg.rexmit_batch_max,
            scan_left: NACK_SCAN_PER_BATCH * self.cfg.rexmit_batch_max,
        };
        for frame in datagram.frames {
            self.handle_frame(now_us, p, frame, &mut budget);
        }
        self.sweep_history();
        Ok(())
    }

    /// Counts a datagram of peer `p`'s life `epoch` dropped for its
    /// epochs, and has our epoch announced to that life (at most once per
    /// `nack_interval_ms`).
    fn refuse_and_announce(&mut self, p: usize, now_us: u64, epoch: u64) {
        let peer = &mut self.peers[p];
        peer.stats.stale_epoch_dropped += 1;
        if now_us >= peer.announce_allowed_us {
            if epoch == peer.epoch {
                peer.announce = true;
            } else {
                peer.vouch_for = Some(epoch);
            }
            peer.announce_allowed_us = now_us + self.cfg.nack_interval_ms * 1000;
        }
    }

    fn handle_frame(&mut self, now_us: u64, p: usize, frame: Frame<'_>, budget: &mut NackBudget) {
        let peer_id = self.peers[p].id;
        match frame {
            Frame::Data {
                group,
                seq,
                rexmit: _,
                frag_index,
                frag_count,
                payload,
            } => {
                let Some(c) = self.channel_for_frame(peer_id, group) else {
                    return;
                };
                let delay_us = self.nack_delay_us(p);
                let ch = &mut self.channels[c];
                if self.events_bytes >= self.cfg.events_bytes_max {
                    // The caller is not draining events: refuse (unacked,
                    // so the sender keeps it) rather than grow.
                    ch.stats.holdback_dropped += 1;
                    return;
                }
                let mut items = std::mem::take(&mut self.items);
                ch.rx.on_data(
                    &self.cfg,
                    now_us,
                    delay_us,
                    seq,
                    frag_index,
                    frag_count,
                    payload,
                    &mut items,
                    &mut self.spare,
                    &mut ch.stats,
                );
                self.emit(peer_id, group, &mut items);
                self.items = items;
            }
            Frame::Ack {
                group,
                probe,
                recv_next,
                send_next,
            } => {
                let Some(c) = self.channel_for_frame(peer_id, group) else {
                    return;
                };
                let delay_us = self.nack_delay_us(p);
                let probe_us = self.probe_after_us(p);
                let ch = &mut self.channels[c];
                let (frames, bytes, reopened) =
                    ch.tx.on_ack(&self.cfg, probe_us, now_us, recv_next);
                self.ledger.freed(frames, bytes);
                ch.rx
                    .on_sender_state(&self.cfg, now_us, delay_us, send_next, probe);
                if reopened {
                    self.events.push_back(Event::Writable {
                        peer: peer_id,
                        group,
                    });
                }
            }
            Frame::Nack { group, ranges } => {
                let Some(&c) = self.channel_index.get(&(peer_id, group)) else {
                    return;
                };
                let ch = &mut self.channels[c];
                ch.stats.nacks_received += 1;
                self.seqs.clear();
                ch.tx.on_nack(
                    &self.cfg,
                    now_us,
                    ranges,
                    budget,
                    &mut self.seqs,
                    &mut ch.stats,
                );
                let queue_max = REXMIT_QUEUE_PER_BATCH * self.cfg.rexmit_batch_max;
                let peer = &mut self.peers[p];
                for &seq in &self.seqs {
                    if peer.rexmit.len() < queue_max {
                        peer.rexmit.push_back((c, seq));
                    } else {
                        ch.stats.rexmit_suppressed += 1;
                    }
                }
            }
            Frame::TooOld { group, base } => {
                let Some(&c) = self.channel_index.get(&(peer_id, group)) else {
                    return;
                };
                let ch = &mut self.channels[c];
                let mut items = std::mem::take(&mut self.items);
                ch.rx.on_too_old(
                    &self.cfg,
                    now_us,
                    base,
                    &mut items,
                    &mut self.spare,
                    &mut ch.stats,
                );
                self.emit(peer_id, group, &mut items);
                self.items = items;
            }
        }
    }

    /// Turns what a receiving half produced into events.
    fn emit(&mut self, peer: NodeId, group: GroupId, items: &mut Vec<RxItem>) {
        for item in items.drain(..) {
            match item {
                RxItem::Message(message) => {
                    self.events_bytes += message.len();
                    self.events.push_back(Event::Delivered {
                        peer,
                        group,
                        message,
                    });
                }
                RxItem::Skipped { first, last } => self.events.push_back(Event::Skipped {
                    peer,
                    group,
                    first_seq: first,
                    last_seq: last,
                }),
            }
        }
    }

    /// Runs the timers that are due: acks, tail-loss probes, NACK rounds.
    /// Call it once the time returned by [`Endpoint::poll_timeout`] has
    /// passed (calling it early is harmless), then drain
    /// [`Endpoint::poll_transmit`].
    pub fn handle_timeout(&mut self, now_us: u64) {
        self.now_us = self.now_us.max(now_us);
        for c in 0..self.channels.len() {
            let probe_us = self.probe_after_us(self.channels[c].peer);
            let ch = &mut self.channels[c];
            if ch.rx.ack_pending && ch.rx.ack_due_us.is_some_and(|d| d <= now_us) {
                ch.rx.ack_now = true;
            }
            if ch.tx.probe_due_us.is_some_and(|d| d <= now_us) {
                ch.tx.probe_fired(probe_us, now_us);
            }
        }
        for p in 0..self.peers.len() {
            if self.nack_due_us(p).is_some_and(|d| d <= now_us) {
                self.nack_round(p, now_us);
            }
        }
    }

    /// When a NACK round for peer `p` is due: the earliest gap whose
    /// reorder window has passed, or the earliest repeat once the per-peer
    /// re-request limit allows it; never sooner than `nack_delay_min_us`
    /// after the previous round.
    fn nack_due_us(&self, p: usize) -> Option<u64> {
        let peer = &self.peers[p];
        let mut first: Option<u64> = None;
        let mut repeat: Option<u64> = None;
        for &c in &peer.channels {
            let rx = &self.channels[c].rx;
            first = min_opt(first, rx.first_nack_due_us);
            repeat = min_opt(repeat, rx.repeat_nack_due_us);
        }
        let repeat = repeat.map(|r| r.max(peer.rerequest_allowed_us));
        Some(min_opt(first, repeat)?.max(peer.nack_allowed_us))
    }

    /// One NACK round for a peer: a frame per channel with due gaps. First
    /// requests of new gaps go out as soon as their reorder window has
    /// passed; requests that repeat an earlier one (the gap is still
    /// there after an RTO) only once per `nack_interval_ms` per peer, and
    /// ride along in the same frames.
    fn nack_round(&mut self, p: usize, now_us: u64) {
        let interval_us = self.cfg.nack_interval_ms * 1000;
        let peer = &mut self.peers[p];
        let repeat_us = peer.nack_repeat_us(interval_us);
        let repeats = now_us >= peer.rerequest_allowed_us;
        // Rounds are at least nack_delay_min_us apart and the driver
        // transmits after every handle_timeout, so nothing is pending
        // here; if something were, a round replaces it rather than stack.
        peer.pending_nacks.clear();
        let mut repeated = false;
        for &c in &peer.channels {
            let ch = &mut self.channels[c];
            if !ch.rx.nack_due(now_us, repeats) {
                continue;
            }
            let (ranges, r) = ch.rx.collect_nack(
                now_us,
                repeats,
                repeat_us,
                self.cfg.nack_ranges_max,
                &mut ch.stats,
            );
            repeated |= r;
            if !ranges.is_empty() {
                ch.stats.nacks_sent += 1;
                peer.pending_nacks.push_back((ch.group, ranges));
            }
        }
        if !peer.pending_nacks.is_empty() {
            peer.nack_allowed_us = now_us + self.cfg.nack_delay_min_us;
            peer.stats.nack_rounds += 1;
        }
        if repeated {
            peer.rerequest_allowed_us = now_us + interval_us;
            peer.stats.nack_repeat_rounds += 1;
        }
    }

    /// The next time [`Endpoint::handle_timeout`] has work, if any. Ask
    /// again after every call that changes the endpoint.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        let mut next: Option<u64> = None;
        let mut consider = |t: Option<u64>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        for ch in &self.channels {
            if ch.rx.ack_pending && !ch.rx.ack_now {
                consider(ch.rx.ack_due_us);
            }
            consider(ch.tx.probe_due_us);
        }
        for p in 0..self.peers.len() {
            consider(self.nack_due_us(p));
        }
        next
    }

    /// Writes the next datagram to send into `buf` (cleared first) and says
    /// where it goes; `None` when there is nothing to send. Call it until
    /// `None` after every `send`, `handle_datagram` and `handle_timeout`.
    /// Datagrams of different peers take turns.
    #[must_use]
    pub fn poll_transmit(&mut self, now_us: u64, buf: &mut Vec<u8>) -> Option<Transmit> {
        buf.clear();
        let t = self.next_unsealed(now_us, buf)?;
        let tag = self.key.tag(&buf[..t.size_bytes - MAC_BYTES]);
        buf[t.size_bytes - MAC_BYTES..].copy_from_slice(&tag);
        Some(t)
    }

    /// [`Endpoint::poll_transmit`] up to `max` times: the datagrams back to
    /// back in `buf` and where each goes in `out` (both cleared first; the
    /// `size_bytes` of each says where the next starts). Their MACs are
    /// computed side by side, which is several times faster per byte than
    /// one by one for datagrams of 1–2 KiB. Returns how many; fewer than
    /// `max` means there is nothing more to send for now.
    pub fn poll_transmits(
        &mut self,
        now_us: u64,
        max: usize,
        buf: &mut Vec<u8>,
        out: &mut Vec<Transmit>,
    ) -> usize {
        buf.clear();
        out.clear();
        while out.len() < max {
            match self.next_unsealed(now_us, buf) {
                Some(t) => out.push(t),
                None => break,
            }
        }
        let mut tags = std::mem::take(&mut self.tags);
        wire::seal_batch(&self.key, buf, out.iter().map(|t| t.size_bytes), &mut tags);
        self.tags = tags;
        out.len()
    }

    /// Appends the next datagram to `buf` with its MAC zeroed (the caller
    /// seals it before it leaves).
    fn next_unsealed(&mut self, now_us: u64, buf: &mut Vec<u8>) -> Option<Transmit> {
        self.now_us = self.now_us.max(now_us);
        let start = buf.len();
        let n = self.peers.len();
        for k in 0..n {
            let p = (self.peer_cursor + k) % n;
            if !self.wants_transmit(p) {
                continue;
            }
            if let Some(t) = self.build(p, now_us, buf) {
                self.peer_cursor = (p + 1) % n;
                // Larger than the datagram limit (the path MTU), IP would
                // fragment or drop it: every retransmission the same, so
                // the channel would stall for good.
                assert!(
                    t.size_bytes == buf.len() - start
                        && t.size_bytes <= self.cfg.datagram_bytes_max()
                );
                assert!(t.peer != self.local && t.peer != 0);
                return Some(t);
            }
        }
        buf.truncate(start);
        None
    }

    fn wants_transmit(&self, p: usize) -> bool {
        let peer = &self.peers[p];
        peer.announce
            || peer.vouch_for.is_some()
            || !peer.pending_nacks.is_empty()
            || !peer.rexmit.is_empty()
            || peer.channels.iter().any(|&c| {
                let ch = &self.channels[c];
                ch.tx.too_old.is_some()
                    || ch.tx.probe_now
                    || ch.rx.ack_now
                    || ch.tx.first_unsent < ch.tx.next_seq
            })
    }

    /// Builds one datagram for peer `p`, most urgent frames first: TOO_OLD
    /// answers, NACKs, acks (due or not: they ride along for free),
    /// retransmissions, then new data from each channel in turn.
    fn build(&mut self, p: usize, now_us: u64, buf: &mut Vec<u8>) -> Option<Transmit> {
        let probe_us = self.probe_after_us(p);
        let cfg = &self.cfg;
        let peer = &mut self.peers[p];
        if let Some(epoch) = peer.vouch_for.take() {
            // Empty: frames, acks and echoes belong to the life we took.
            let header = Header {
                sender: self.local,
                receiver: peer.id,
                epoch: self.epoch,
                peer_epoch: epoch,
                sent_us: now_us as u32,
                echo: None,
            };
            let w = DatagramWriter::append(buf, &header, cfg.datagram_bytes_max());
            let size_bytes = w.finish_unsealed();
            peer.stats.datagrams_sent += 1;
            peer.stats.bytes_sent += size_bytes as u64;
            return Some(Transmit {
                peer: peer.id,
                group: None,
                size_bytes,
            });
        }
        let header = Header {
            sender: self.local,
            receiver: peer.id,
            epoch: self.epoch,
            peer_epoch: peer.epoch,
            sent_us: now_us as u32,
            echo: peer.echo_for(now_us),
        };
        let start = buf.len();
        let mut w = DatagramWriter::append(buf, &header, cfg.datagram_bytes_max());
        let announce = std::mem::take(&mut peer.announce);

        for &c in &peer.channels {
            let ch = &mut self.channels[c];
            if let Some(base) = ch.tx.too_old {
                if w.too_old(ch.group, base) {
                    ch.tx.too_old = None;
                    ch.stats.too_old_sent += 1;
                }
            }
        }
        while let Some((group, ranges)) = peer.pending_nacks.front() {
            if !w.nack(*group, ranges) {
                break;
            }
            peer.pending_nacks.pop_front();
        }
        for &c in &peer.channels {
            let ch = &mut self.channels[c];
            if !(ch.rx.ack_pending || ch.rx.ack_now || ch.tx.probe_now) {
                continue;
            }
            let probe = ch.tx.probe_now;
            if w.ack(ch.group, probe, ch.rx.next_deliver, ch.tx.send_next()) {
                ch.rx.ack_written();
                if probe {
                    ch.tx.probe_now = false;
                    ch.stats.probes_sent += 1;
                }
            }
        }
        while let Some(&(c, seq)) = peer.rexmit.front() {
            let ch = &mut self.channels[c];
            let Some(f) = ch.tx.frame_mut(seq) else {
                // Acknowledged or evicted since it was asked for.
                peer.rexmit.pop_front();
                continue;
            };
            if !w.data_pieces(f.fields(ch.group, seq, true), f.len(), f.payload()) {
                break;
            }
            ch.stats.rexmit_frames += 1;
            ch.stats.rexmit_bytes += f.len() as u64;
            peer.rexmit.pop_front();
        }
        let n = peer.channels.len();
        for k in 0..n {
            let c = peer.channels[(peer.data_cursor + k) % n];
            let ch = &mut self.channels[c];
            debug_assert!(ch.tx.first_unsent >= ch.tx.hist_base);
            while ch.tx.first_unsent < ch.tx.next_seq {
                let seq = ch.tx.first_unsent;
                let Some(f) = ch.tx.frame_mut(seq) else {
                    break;
                };
                if !w.data_pieces(f.fields(ch.group, seq, false), f.len(), f.payload()) {
                    break;
                }
                ch.tx.sent_first(probe_us, now_us);
                ch.stats.frames_sent += 1;
            }
        }
        if n > 0 {
            peer.data_cursor = (peer.data_cursor + 1) % n;
        }
        if w.frames() == 0 && !announce {
            buf.truncate(start);
            return None;
        }
        let group = w.first_group();
        let size_bytes = w.finish_unsealed();
        peer.stats.datagrams_sent += 1;
        peer.stats.bytes_sent += size_bytes as u64;
        Some(Transmit {
            peer: peer.id,
            group,
            size_bytes,
        })
    }

    /// The next event: a delivered message, a skipped gap, a window that
    /// reopened, a peer restart. Drain it after every `handle_datagram`;
    /// while more than `events_bytes_max` of messages wait here, incoming
    /// data is refused.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        let e = self.events.pop_front()?;
        if let Event::Delivered { message, .. } = &e {
            // `events_bytes` is what refuses incoming data while the
            // caller lags: drifting up, it would refuse data for good;
            // down (wrapping), it would let the queue grow unbounded.
            assert!(self.events_bytes >= message.len());
            self.events_bytes -= message.len();
        }
        assert!(!self.events.is_empty() || self.events_bytes == 0);
        Some(e)
    }

    /// Gives back the buffer of a delivered message the caller is done
    /// with, so that reassembling a later message reuses it instead of
    /// allocating. Optional (a buffer not given back is simply freed);
    /// call it after handling each `Event::Delivered` on a hot path. Only
    /// a few buffers are kept, bounded in count and bytes.
    pub fn recycle_message(&mut self, message: Vec<u8>) {
        self.spare.give(message);
    }

    /// Endpoint-wide counters.
    pub fn stats(&self) -> EndpointStats {
        EndpointStats {
            history_bytes: self.ledger.bytes as u64,
            ..self.stats
        }
    }

    /// Counters of one peer, if known.
    pub fn peer_stats(&self, peer: NodeId) -> Option<PeerStats> {
        self.peer_index.get(&peer).map(|&p| self.peers[p].stats)
    }

    /// Counters of one channel, if it exists.
    pub fn channel_stats(&self, peer: NodeId, group: GroupId) -> Option<ChannelStats> {
        self.channel_index
            .get(&(peer, group))
            .map(|&c| self.channels[c].stats)
    }

    /// Positions of one channel, if it exists.
    pub fn channel_state(&self, peer: NodeId, group: GroupId) -> Option<ChannelState> {
        let ch = &self.channels[*self.channel_index.get(&(peer, group))?];
        Some(ChannelState {
            send_next: ch.tx.next_seq,
            acked: ch.tx.acked,
            history_base: ch.tx.hist_base,
            in_flight_bytes: ch.tx.inflight_bytes as u64,
            recv_next: ch.rx.next_deliver,
            holdback_frames: ch.rx.holdback_frames as u64,
            holdback_bytes: ch.rx.holdback_bytes as u64,
        })
    }

    /// Every peer known, in id order.
    pub fn peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.peer_index.keys().copied()
    }

    /// Every channel, as (peer, group), in order.
    pub fn channels(&self) -> impl Iterator<Item = (NodeId, GroupId)> + '_ {
        self.channel_index.keys().copied()
    }

    /// The wait before a gap just found on a channel with peer `p` may be
    /// requested: the peer's reorder window plus up to a quarter of it at
    /// random, so that the requests of many receivers (or channels) that
    /// saw the same loss do not all go out at the same instant.
    fn nack_delay_us(&mut self, p: usize) -> u64 {
        let window_us =
            self.peers[p].reorder_window_us(self.cfg.nack_delay_min_us, self.cfg.nack_delay_max_us);
        window_us + self.rng.gen_range(0..=window_us / 4)
    }

    /// How long after a transmission a channel with peer `p` may probe.
    fn probe_after_us(&self, p: usize) -> u64 {
        self.peers[p].probe_after_us(self.cfg.probe_interval_ms * 1000, self.cfg.ack_delay_us)
    }

    fn peer_or_create(&mut self, id: NodeId) -> Result<usize, Limit> {
        if let Some(&p) = self.peer_index.get(&id) {
            return Ok(p);
        }
        if self.peers.len() >= self.cfg.peers_max {
            return Err(Limit::Peers);
        }
        self.peers.push(Peer::new(id));
        self.peer_index.insert(id, self.peers.len() - 1);
        Ok(self.peers.len() - 1)
    }

    fn channel_or_create(&mut self, peer: NodeId, group: GroupId) -> Result<usize, Limit> {
        if let Some(&c) = self.channel_index.get(&(peer, group)) {
            return Ok(c);
        }
        let p = self.peer_or_create(peer)?;
        if self.channels.len() >= self.cfg.channels_max {
            return Err(Limit::Channels);
        }
        let c = self.channels.len();
        self.channels.push(Channel {
            peer: p,
            group,
            tx: TxHalf::new(),
            rx: RxHalf::new(),
            stats: ChannelStats::default(),
        });
        self.peers[p].channels.push(c);
        self.channel_index.insert((peer, group), c);
        Ok(c)
    }

    fn channel_for_frame(&mut self, peer: NodeId, group: GroupId) -> Option<usize> {
        match self.channel_or_create(peer, group) {
            Ok(c) => Some(c),
            Err(_) => {
                self.stats.channels_over_limit_dropped += 1;
                None
            }
        }
    }

    /// The peer has a new epoch: both directions of every channel with it
    /// start over.
    fn peer_restarted(&mut self, p: usize) {
        let peer_id = self.peers[p].id;
        self.peers[p].stats.restarts_seen += 1;
        // An announcement pending for an epoch of the peer's is moot now.
        self.peers[p].vouch_for = None;
        self.events
            .push_back(Event::PeerRestarted { peer: peer_id });
        for &c in &self.peers[p].channels {
            let ch = &mut self.channels[c];
            debug_assert_eq!(ch.peer, p);
            let (frames, bytes, stalled) = ch.tx.reset();
            self.ledger.freed(frames, bytes);
            ch.rx.reset();
            if stalled {
                self.events.push_back(Event::Writable {
                    peer: peer_id,
                    group: ch.group,
                });
            }
        }
    }

    /// Evicts the endpoint's oldest frames until the history fits
    /// `history_bytes_max`.
    fn enforce_history_budget(&mut self) {
        while self.ledger.bytes > self.cfg.history_bytes_max {
            let Some((stamp, c)) = self.ledger.pop_oldest() else {
                break;
            };
            let probe_us = self.probe_after_us(self.channels[c].peer);
            let tx = &mut self.channels[c].tx;
            let front = tx.history.front().map(|f| f.stamp);
            debug_assert!(front.is_none_or(|f| stamp <= f), "ledger out of order");
            if front == Some(stamp) {
                let len = tx.evict_front().unwrap_or(0);
                self.ledger.freed(1, len);
                self.stats.history_evicted_frames += 1;
                if tx.first_unsent < tx.hist_base {
                    // Evicted before it ever went out: count it as sent and
                    // tell the receiver how far we got at once (a probe), so
                    // it asks, hears "too old", and skips. Without this a
                    // channel whose every frame was evicted unsent would
                    // wait for an ack that nothing can cause.
                    tx.first_unsent = tx.hist_base;
                    tx.probe_now = true;
                    tx.probe_due_us.get_or_insert(self.now_us + probe_us);
                }
            }
        }
        self.sweep_history();
    }

    fn sweep_history(&mut self) {
        if self.ledger.needs_sweep() {
            let channels = &self.channels;
            self.ledger.sweep(|stamp, c| {
                channels[c]
                    .tx
                    .history
                    .front()
                    .is_some_and(|f| stamp >= f.stamp)
            });
        }
    }
}

/// The earlier of two optional times.
fn min_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const HEADER_BYTES_FOR_TEST: usize = wire::HEADER_BYTES;

    fn pair(cfg: TransportConfig) -> (Endpoint, Endpoint) {
        let key = ClusterKey::derive(b"endpoint tests");
        (
            Endpoint::new(cfg.clone(), key.clone(), 1, 1).unwrap(),
            Endpoint::new(cfg, key, 2, 2).unwrap(),
        )
    }

    /// Moves every datagram from `a` to `b` at `now_us`; returns how many.
    fn pump(now_us: u64, a: &mut Endpoint, b: &mut Endpoint) -> usize {
        let mut buf = Vec::new();
        let mut n = 0;
        while let Some(t) = a.poll_transmit(now_us, &mut buf) {
            assert_eq!(t.size_bytes, buf.len());
            b.handle_datagram(now_us, &buf).unwrap();
            n += 1;
        }
        n
    }

    fn delivered(e: &mut Endpoint) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(ev) = e.poll_event() {
            if let Event::Delivered { message, .. } = ev {
                out.push(message);
            }
        }
        out
    }

    /// A message of pieces (own bytes and shared payloads, fragments
    /// cut across them at a small MTU) goes out as the same datagrams as
    /// its flat bytes, and its retransmissions, cut from the pieces too
    /// after half the first datagrams are lost, deliver it whole.
    #[test]
    fn a_message_of_pieces_is_sent_and_retransmitted_as_its_flat_bytes() {
        let cfg = TransportConfig {
            mtu_bytes: 1500,
            ..TransportConfig::default()
        };
        let mut pieces = OutMessage::with_buffer(Vec::new());
        for i in 0..12u8 {
            pieces.put(&[i; 7]);
            let payload = bytes::Bytes::from(vec![i.wrapping_mul(31); 600 + 97 * i as usize]);
            pieces.put_shared(&payload);
        }
        let flat = pieces.to_vec();
        assert!(
            flat.len() > 8 * cfg.fragment_bytes_max(),
            "several fragments"
        );
        let datagrams = |e: &mut Endpoint| {
            let mut out = Vec::new();
            let mut buf = Vec::new();
            while e.poll_transmit(10, &mut buf).is_some() {
                out.push(buf.clone());
            }
            out
        };
        let (mut flat_a, _) = pair(cfg.clone());
        flat_a.send_buffer(2, 0, flat.clone()).unwrap();
        let (mut a, mut b) = pair(cfg);
        a.send_message(2, 0, pieces).unwrap();
        let sent = datagrams(&mut a);
        assert_eq!(sent, datagrams(&mut flat_a), "the wire changed");
        for d in sent.iter().step_by(2) {
            b.handle_datagram(10, d).unwrap();
        }
        let mut got = delivered(&mut b);
        let mut now = 10;
        while got.is_empty() {
            now += 5_000;
            assert!(now < 10_000_000, "never delivered");
            a.handle_timeout(now);
            b.handle_timeout(now);
            pump(now, &mut b, &mut a);
            pump(now, &mut a, &mut b);
            got = delivered(&mut b);
        }
        assert!(
            a.channel_stats(2, 0).unwrap().rexmit_frames > 0,
            "no retransmission"
        );
        assert_eq!(got, vec![flat]);
    }

    #[test]
    fn a_buffer_sent_is_kept_as_it_is_and_reused_once_out_of_the_history() {
        let cfg = TransportConfig {
            history_bytes_max: 8 << 10,
            message_bytes_max: 8 << 10,
            ..TransportConfig::default()
        };
        let (mut a, mut b) = pair(cfg);
        let mut first = a.message_buffer(2, 0, 5000);
        assert!(first.capacity() >= 5000, "no channel yet: a new one");
        first.extend_from_slice(&[7; 5000]);
        let at = first.as_ptr();
        a.send_buffer(2, 0, first).unwrap();
        pump(10, &mut a, &mut b);
        assert_eq!(delivered(&mut b), vec![vec![7; 5000]]);
        // Nothing left the history yet: a fresh buffer.
        let fresh = a.message_buffer(2, 0, 5000);
        assert_ne!(fresh.as_ptr(), at);
        // The second message pushes the first out of the 8 KiB history;
        // its buffer, not a copy of it, comes back for the third.
        a.send(2, 0, &[8; 8000]).unwrap();
        pump(20, &mut a, &mut b);
        assert_eq!(delivered(&mut b), vec![vec![8; 8000]]);
        // Too small for 6000 bytes: not that one.
        let larger = a.message_buffer(2, 0, 6000);
        assert_ne!(larger.as_ptr(), at);
        let again = a.message_buffer(2, 0, 4000);
        assert!(again.is_empty() && again.capacity() >= 5000);
        assert_eq!(
            again.as_ptr(),
            at,
            "the history kept the sent buffer itself"
        );
        // Refused as `send` refuses.
        let huge = vec![0; a.config().message_bytes_max + 1];
        assert!(matches!(
            a.send_buffer(2, 0, huge),
            Err(SendError::TooLarge { .. })
        ));
    }

    #[test]
    fn batched_send_and_receive_match_one_by_one_and_reject_forgeries() {
        let cfg = TransportConfig::default();
        let (mut a, mut b) = pair(cfg.clone());
        let msg: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        a.send(2, 0, &msg).unwrap();
        a.send(2, 1, b"small").unwrap();
        let (mut buf, mut out) = (Vec::new(), Vec::new());
        let n = a.poll_transmits(10, 1000, &mut buf, &mut out);
        assert!(n > 60 && n == out.len());
        let mut datagrams: Vec<Vec<u8>> = Vec::new();
        let mut at = 0;
        for t in &out {
            datagrams.push(buf[at..at + t.size_bytes].to_vec());
            at += t.size_bytes;
        }
        assert_eq!(at, buf.len());
        assert_eq!(a.poll_transmits(10, 1000, &mut buf, &mut out), 0);
        // Every datagram of the batch is sealed: the one-by-one decoder
        // takes it.
        for d in &datagrams {
            wire::decode(&a.key, d).unwrap();
        }
        // A forgery (one bit flipped), one too short, a replay.
        let mut forged = datagrams[3].clone();
        forged[HEADER_BYTES_FOR_TEST + 5] ^= 1;
        datagrams.insert(4, forged);
        datagrams.insert(7, vec![0x71, 0x54, 1]);
        datagrams.push(datagrams[0].clone());
        let refs: Vec<&[u8]> = datagrams.iter().map(|d| &d[..]).collect();

        let key = ClusterKey::derive(b"endpoint tests");
        let mut one = Endpoint::new(cfg.clone(), key.clone(), 2, 2).unwrap();
        let one_results: Vec<_> = refs.iter().map(|d| one.handle_datagram(20, d)).collect();
        let mut rejected = Vec::new();
        b.handle_datagrams(20, &refs, |i, why| rejected.push((i, why)));
        let want: Vec<_> = one_results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.err().map(|e| (i, e)))
            .collect();
        assert_eq!(rejected, want);
        assert!(rejected.contains(&(4, DropReason::Decode(DecodeError::BadMac))));
        assert!(rejected.contains(&(7, DropReason::Decode(DecodeError::TooShort))));
        assert_eq!(b.stats(), one.stats());
        assert_eq!(b.stats().mac_failures, 1);
        let got = delivered(&mut b);
        assert_eq!(got, delivered(&mut one));
        assert_eq!(got.len(), 2);
        assert!(got.contains(&msg));
    }

    #[test]
    fn small_messages_of_all_groups_share_a_datagram() {
        let (mut a, mut b) = pair(TransportConfig::default());
        for g in 0..8 {
            a.send(2, g, b"heartbeat").unwrap();
        }
        assert_eq!(pump(0, &mut a, &mut b), 1, "eight heartbeats, one datagram");
        let got = delivered(&mut b);
        assert_eq!(got.len(), 8);
    }

    #[test]
    fn large_message_is_fragmented_and_reassembled() {
        let (mut a, mut b) = pair(TransportConfig::default());
        let msg: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let seqs = a.send(2, 0, &msg).unwrap();
        assert_eq!(seqs.clone().count(), a.config().fragments(msg.len()));
        let n = pump(0, &mut a, &mut b);
        assert_eq!(n, seqs.count());
        assert_eq!(delivered(&mut b), vec![msg]);
    }

    #[test]
    fn a_recycled_buffer_carries_the_next_fragmented_message() {
        let (mut a, mut b) = pair(TransportConfig::default());
        let first: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        a.send(2, 0, &first).unwrap();
        pump(0, &mut a, &mut b);
        let got = delivered(&mut b);
        assert_eq!(got, vec![first.clone()]);
        let buf = got.into_iter().next().unwrap();
        let ptr = buf.as_ptr();
        b.recycle_message(buf);
        // A different, shorter message: the old bytes must not show.
        let second: Vec<u8> = (0..50_000u32).map(|i| (i % 241) as u8).collect();
        a.send(2, 0, &second).unwrap();
        pump(0, &mut a, &mut b);
        let got = delivered(&mut b);
        assert_eq!(got, vec![second]);
        assert_eq!(got[0].as_ptr(), ptr, "the given-back buffer was not reused");
    }

    #[test]
    fn window_blocks_then_reopens_after_acks() {
        let cfg = TransportConfig {
            window_bytes: 10_000,
            message_bytes_max: 4_000,
            holdback_bytes_max: 10_000,
            events_bytes_max: 10_000,
            ..Default::default()
        };
        let (mut a, mut b) = pair(cfg);
        let m = vec![7u8; 4_000];
        a.send(2, 0, &m).unwrap();
        a.send(2, 0, &m).unwrap();
        assert_eq!(a.send(2, 0, &m), Err(SendError::WouldBlock));
        assert_eq!(a.channel_stats(2, 0).unwrap().window_stalls, 1);
        pump(0, &mut a, &mut b);
        assert_eq!(delivered(&mut b).len(), 2);
        // b acks after ack_delay_us.
        let t = b.poll_timeout().unwrap();
        assert_eq!(t, a.config().ack_delay_us);
        b.handle_timeout(t);
        pump(t, &mut b, &mut a);
        let mut writable = false;
        while let Some(e) = a.poll_event() {
            writable |= e == Event::Writable { peer: 2, group: 0 };
        }
        assert!(writable);
        assert_eq!(a.channel_state(2, 0).unwrap().in_flight_bytes, 0);
        assert_eq!(a.stats().history_bytes, 0);
        a.send(2, 0, &m).unwrap();
    }

    #[test]
    fn history_budget_evicts_oldest_first_and_answers_too_old() {
        let cfg = TransportConfig {
            history_bytes_max: 4 << 20,
            ..Default::default()
        };
        let (mut a, mut b) = pair(cfg);
        let m = vec![1u8; 1_000_000];
        a.send(2, 0, &m).unwrap();
        a.send(2, 1, &m).unwrap();
        a.send(2, 0, &m).unwrap();
        a.send(2, 1, &m).unwrap();
        a.send(2, 0, &m).unwrap();
        assert!(a.stats().history_bytes <= 4 << 20);
        assert!(a.stats().history_evicted_frames > 0);
        // Group 0's first message lost its head: a NACK gets "too old".
        let s = a.channel_state(2, 0).unwrap();
        assert!(s.history_base > 1);
        let mut buf = Vec::new();
        // Drop every datagram: b learns of the data only from a probe.
        while a.poll_transmit(0, &mut buf).is_some() {}
        let mut now = 0;
        for _ in 0..1_000 {
            let Some(t) = [a.poll_timeout(), b.poll_timeout()]
                .into_iter()
                .flatten()
                .min()
            else {
                break;
            };
            now = t;
            a.handle_timeout(now);
            b.handle_timeout(now);
            pump(now, &mut a, &mut b);
            pump(now, &mut b, &mut a);
        }
        let st = b.channel_stats(1, 0).unwrap();
        assert!(st.too_old_received > 0, "{st:?} at {now}");
        assert!(st.gaps_skipped > 0);
        let mut skipped = 0;
        let mut got = 0;
        while let Some(e) = b.poll_event() {
            match e {
                Event::Skipped {
                    group: 0, last_seq, ..
                } => {
                    assert!(last_seq < a.channel_state(2, 0).unwrap().history_base);
                    skipped += 1;
                }
                Event::Delivered { .. } => got += 1,
                _ => {}
            }
        }
        assert!(skipped > 0 && got > 0);
    }

    #[test]
    fn zero_node_id_and_bad_config_are_refused() {
        let key = ClusterKey::derive(b"x");
        assert!(Endpoint::new(TransportConfig::default(), key.clone(), 0, 1).is_err());
        let bad = TransportConfig {
            mtu_bytes: 10,
            ..Default::default()
        };
        assert!(Endpoint::new(bad, key, 1, 1).is_err());
    }
}
