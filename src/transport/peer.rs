//! What the endpoint knows of one peer: its session epoch (and its earlier
//! ones, to drop their datagrams), the round-trip estimate and the timers
//! derived from it (reorder window, RTO), the NACK rate limits, and the
//! output waiting for it that is not owned by a channel.
//!
//! Session epochs are random, so they cannot be ordered: a datagram with an
//! epoch we have never seen is taken as a restart, and the epoch it
//! replaces is retired. A datagram of a retired epoch is a replay or a
//! straggler and is dropped. Only `retired_epochs_max` are remembered, so a
//! datagram that survives that many restarts of its sender would reset the
//! channels once more; on a LAN, where a datagram lives milliseconds and a
//! restart takes seconds, that cannot happen by accident.
//!
//! An unknown epoch may also be a dead life we never heard of: we
//! restarted too, and a straggler (or a replay) of the peer's life before
//! the one we know arrives late. Taking it for a restart would retire the
//! live epoch, and every later datagram of the live peer would be dropped
//! for good. So once the peer's current epoch has *vouched* for our life
//! (sent a datagram addressed to our epoch: it is alive, and knows us), a
//! new epoch replaces it only through a datagram that vouches for us too.
//! A new life's first datagrams, which know no epoch of ours, are dropped
//! then and answered with an announcement addressed to that new life (an
//! empty datagram; frames belong to the life we took); its next ones
//! vouch. And a retired epoch comes back when it vouches for us while the
//! one that replaced it never did, or has been silent for
//! `epoch_silence_ms`: a dead life's straggler that slipped in (before the
//! live one had heard from us, or having heard from us itself) is replaced
//! within that time. For that, a datagram of a retired epoch is answered
//! the same way while the epoch we took has not vouched: otherwise the live
//! life, refused here, and our life, addressing only the straggler there,
//! would each wait for the other to vouch, for good (two stragglers of
//! dead lives, released together when a partition healed, did that to a
//! new life: simulator seed 22 of the queue workload).
//! The sessions then start over on our side only: the peer's receiving
//! half drops our first frames as duplicates of what it already had from
//! us, as many frames as we sent it while the straggler was on its way
//! (consensus resends), and its history answers our requests "too old".

use super::stats::PeerStats;
use super::wire::Echo;
use super::GroupId;
use crate::consensus::NodeId;
use std::collections::VecDeque;

/// An RTT sample above this is taken as a bogus echo and ignored, in µs.
const RTT_SAMPLE_MAX_US: u32 = 10_000_000;

/// The minimum RTT is the lowest sample of this long, in µs; an older
/// minimum is replaced by the next sample, so a route that became slower
/// is noticed within this time (BBR's min_rtt filter, without probing).
const RTT_MIN_WINDOW_US: u64 = 10_000_000;

/// The reorder window is this fraction (1/n) of the minimum RTT, as in
/// RACK (RFC 8985 section 6.2: `reo_wnd = min_rtt / 4`).
const REORDER_RTT_DIVISOR: u64 = 4;

/// How a datagram's sender epoch relates to what we know of the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EpochCheck {
    /// The epoch we know.
    Current,
    /// The first epoch we hear from this peer.
    First,
    /// A new epoch: the peer restarted; everything about it is stale.
    Restarted,
    /// An epoch the peer had before: drop the datagram (and, while the
    /// current one has not vouched, announce ourselves to that epoch).
    Retired,
    /// A new epoch that does not vouch for our life while the current
    /// one has: drop the datagram and announce ourselves to it (a new
    /// life answers with a datagram that vouches).
    Unconfirmed,
}

/// The bounds `Peer::check_epoch` works within (from the config).
#[derive(Clone, Copy, Debug)]
pub(super) struct EpochLimits {
    /// Retired epochs remembered (`retired_epochs_max`).
    pub(super) retired_max: usize,
    /// `epoch_silence_ms`, in µs.
    pub(super) silence_us: u64,
}

/// Which of our lives a datagram is addressed to (its `peer_epoch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Addressed {
    /// Our current epoch.
    Us,
    /// None: the sender knows no epoch of ours.
    Unknown,
    /// An earlier life of ours.
    Earlier,
}

/// One peer.
pub(super) struct Peer {
    /// Its node id.
    pub(super) id: NodeId,
    /// Its current session epoch; 0 until we hear from it.
    pub(super) epoch: u64,
    /// The current epoch has sent a datagram addressed to our epoch.
    vouched: bool,
    /// When a datagram of the current epoch last arrived.
    heard_us: u64,
    retired: VecDeque<u64>,
    /// Indexes of its channels in the endpoint, in creation order.
    pub(super) channels: Vec<usize>,
    /// No NACK round that repeats a request before this time: the
    /// per-peer rate limit of re-requests (`nack_interval_ms`).
    pub(super) rerequest_allowed_us: u64,
    /// No NACK round at all before this time (`nack_delay_min_us` after
    /// the last one): first requests of gaps found close together share a
    /// datagram.
    pub(super) nack_allowed_us: u64,
    /// NACK frames of the latest round, waiting for a datagram.
    pub(super) pending_nacks: VecDeque<(GroupId, Vec<(u64, u32)>)>,
    /// Send a datagram even if empty, so the peer learns our epoch.
    pub(super) announce: bool,
    /// An epoch of the peer we refused (a new one not taken, or a retired
    /// one) to address an empty datagram to, so that, if it is the live
    /// life, it learns our epoch and its next datagrams vouch for us.
    pub(super) vouch_for: Option<u64>,
    /// No announcement before this time (rate limit).
    pub(super) announce_allowed_us: u64,
    /// Retransmissions waiting for a datagram: (channel index, seq).
    pub(super) rexmit: VecDeque<(usize, u64)>,
    /// The peer's latest `sent_us` and when we received it.
    echo: Option<(u32, u64)>,
    /// Latest echo an RTT sample was taken from.
    last_echo_sampled: Option<u32>,
    /// When `stats.rtt_min_us` was sampled.
    rtt_min_at_us: u64,
    /// Round-robin position among the channels for new data.
    pub(super) data_cursor: usize,
    /// Counters.
    pub(super) stats: PeerStats,
}

impl Peer {
    pub(super) fn new(id: NodeId) -> Self {
        Peer {
            id,
            epoch: 0,
            vouched: false,
            heard_us: 0,
            retired: VecDeque::new(),
            channels: Vec::new(),
            rerequest_allowed_us: 0,
            nack_allowed_us: 0,
            rtt_min_at_us: 0,
            pending_nacks: VecDeque::new(),
            announce: false,
            vouch_for: None,
            announce_allowed_us: 0,
            rexmit: VecDeque::new(),
            echo: None,
            last_echo_sampled: None,
            data_cursor: 0,
            stats: PeerStats::default(),
        }
    }

    /// Whether the current epoch has sent a datagram addressed to ours.
    pub(super) fn has_vouched(&self) -> bool {
        self.vouched
    }

    /// Classifies `epoch`, of a datagram addressed to `to` arriving at
    /// `now_us`, and adopts it if it is new (see the module documentation).
    pub(super) fn check_epoch(
        &mut self,
        now_us: u64,
        epoch: u64,
        to: Addressed,
        limits: EpochLimits,
    ) -> EpochCheck {
        let vouches = to == Addressed::Us;
        if epoch == self.epoch {
            self.vouched |= vouches;
            self.heard_us = now_us;
            return EpochCheck::Current;
        }
        if self.retired.contains(&epoch) {
            // Retired for an epoch that never vouched for us, or that has
            // fallen silent: that one was a straggler of a dead life,
            // most likely, and this one is alive and knows us.
            let silent = now_us >= self.heard_us.saturating_add(limits.silence_us);
            if !(vouches && (!self.vouched || silent)) {
                return EpochCheck::Retired;
            }
            self.retired.retain(|&e| e != epoch);
        } else if self.vouched && !vouches {
            return EpochCheck::Unconfirmed;
        }
        self.heard_us = now_us;
        self.vouched = vouches;
        if self.epoch == 0 {
            self.epoch = epoch;
            return EpochCheck::First;
        }
        self.retired.push_back(self.epoch);
        while self.retired.len() > limits.retired_max {
            self.retired.pop_front();
        }
        self.epoch = epoch;
        // Timing state belonged to the old life.
        self.echo = None;
        self.last_echo_sampled = None;
        self.rerequest_allowed_us = 0;
        self.nack_allowed_us = 0;
        self.pending_nacks.clear();
        self.rexmit.clear();
        EpochCheck::Restarted
    }

    /// Records the peer's clock from an accepted datagram, and takes an
    /// RTT sample from its echo of ours.
    pub(super) fn on_header(&mut self, now_us: u64, sent_us: u32, echo: Option<Echo>) {
        if let Some(e) = echo {
            // Only a newer echo than the last sampled: a replayed or
            // reordered datagram would inflate the estimate.
            let newer = self
                .last_echo_sampled
                .is_none_or(|last| (e.sent_us.wrapping_sub(last) as i32) > 0);
            let sample = (now_us as u32)
                .wrapping_sub(e.sent_us)
                .wrapping_sub(e.delay_us);
            if newer && sample < RTT_SAMPLE_MAX_US {
                self.last_echo_sampled = Some(e.sent_us);
                self.rtt_sample(now_us, sample as u64);
            }
        }
        self.echo = Some((sent_us, now_us));
    }

    /// RFC 6298's smoothed RTT and variation, and the windowed minimum.
    fn rtt_sample(&mut self, now_us: u64, sample_us: u64) {
        let s = &mut self.stats;
        if s.rtt_samples == 0
            || sample_us <= s.rtt_min_us
            || now_us >= self.rtt_min_at_us + RTT_MIN_WINDOW_US
        {
            s.rtt_min_us = sample_us;
            self.rtt_min_at_us = now_us;
        }
        if s.rtt_samples == 0 {
            s.rtt_us = sample_us;
            s.rtt_var_us = sample_us / 2;
        } else {
            s.rtt_var_us = (3 * s.rtt_var_us + s.rtt_us.abs_diff(sample_us)) / 4;
            s.rtt_us = (7 * s.rtt_us + sample_us) / 8;
        }
        s.rtt_samples += 1;
    }

    /// The echo to put in a datagram built at `now_us`.
    pub(super) fn echo_for(&self, now_us: u64) -> Option<Echo> {
        self.echo.map(|(sent_us, at_us)| Echo {
            sent_us,
            delay_us: now_us.saturating_sub(at_us).min(u32::MAX as u64) as u32,
        })
    }

    /// The retransmission timeout, srtt + 4 rttvar (RFC 6298), in µs; 0
    /// before the first sample (callers take a configured floor with it).
    pub(super) fn rto_us(&self) -> u64 {
        self.stats.rtt_us + 4 * self.stats.rtt_var_us
    }

    /// How long before a requested seq is requested again: the NACK
    /// interval, or the retransmission timeout when the path is slower. A
    /// re-request before the RTO would ask for a retransmission that may
    /// still be on its way: the implosion the bound in `mod.rs` excludes.
    pub(super) fn nack_repeat_us(&self, nack_interval_us: u64) -> u64 {
        nack_interval_us.max(self.rto_us())
    }

    /// How long a gap waits before its first request, before jitter:
    /// min RTT / 4 (RACK's reorder window), within
    /// `[delay_min_us, delay_max_us]`; the maximum until the first RTT
    /// sample, when nothing is known of the path's reordering.
    pub(super) fn reorder_window_us(&self, delay_min_us: u64, delay_max_us: u64) -> u64 {
        if self.stats.rtt_samples == 0 {
            return delay_max_us;
        }
        (self.stats.rtt_min_us / REORDER_RTT_DIVISOR).clamp(delay_min_us, delay_max_us)
    }

    /// The earliest a tail-loss probe may follow the last transmission:
    /// `probe_us`, or the RTO plus the receiver's ack delay if longer, so
    /// a probe never fires while the ack it asks for could be on its way.
    pub(super) fn probe_after_us(&self, probe_us: u64, ack_delay_us: u64) -> u64 {
        if self.stats.rtt_samples == 0 {
            return probe_us;
        }
        probe_us.max(self.rto_us() + ack_delay_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: EpochLimits = EpochLimits {
        retired_max: 2,
        silence_us: 500_000,
    };

    #[test]
    fn epochs_first_restart_retired() {
        use Addressed::Unknown;
        let mut p = Peer::new(2);
        assert_eq!(p.check_epoch(0, 10, Unknown, LIMITS), EpochCheck::First);
        assert_eq!(p.check_epoch(0, 10, Unknown, LIMITS), EpochCheck::Current);
        assert_eq!(p.check_epoch(0, 11, Unknown, LIMITS), EpochCheck::Restarted);
        assert_eq!(p.check_epoch(0, 10, Unknown, LIMITS), EpochCheck::Retired);
        assert_eq!(p.check_epoch(0, 12, Unknown, LIMITS), EpochCheck::Restarted);
        assert_eq!(p.check_epoch(0, 13, Unknown, LIMITS), EpochCheck::Restarted);
        // Only two are remembered: 10 has been forgotten.
        assert_eq!(p.check_epoch(0, 11, Unknown, LIMITS), EpochCheck::Retired);
        assert_eq!(p.check_epoch(0, 12, Unknown, LIMITS), EpochCheck::Retired);
        assert_eq!(p.retired.len(), 2);
    }

    #[test]
    fn once_vouched_only_a_vouching_epoch_replaces_it() {
        use Addressed::{Earlier, Unknown, Us};
        const T: u64 = 1_000;
        let mut p = Peer::new(2);
        assert_eq!(p.check_epoch(T, 10, Unknown, LIMITS), EpochCheck::First);
        // Not vouched yet: anything new is a restart, as before.
        assert_eq!(p.check_epoch(T, 11, Earlier, LIMITS), EpochCheck::Restarted);
        assert_eq!(p.check_epoch(T, 11, Us, LIMITS), EpochCheck::Current);
        // 11 knows us: an epoch that does not is not taken for a restart.
        assert_eq!(
            p.check_epoch(T, 12, Unknown, LIMITS),
            EpochCheck::Unconfirmed
        );
        assert_eq!(
            p.check_epoch(T, 13, Earlier, LIMITS),
            EpochCheck::Unconfirmed
        );
        assert_eq!(p.epoch, 11);
        // A new life that has heard from us is.
        assert_eq!(p.check_epoch(T, 12, Us, LIMITS), EpochCheck::Restarted);
        assert_eq!(p.check_epoch(T, 11, Us, LIMITS), EpochCheck::Retired);
        // The datagram that brought 12 vouched for us already.
        assert_eq!(
            p.check_epoch(T, 14, Unknown, LIMITS),
            EpochCheck::Unconfirmed
        );
    }

    #[test]
    fn a_retired_epoch_that_vouches_comes_back_from_a_silent_one() {
        use Addressed::{Earlier, Unknown, Us};
        let mut p = Peer::new(2);
        // 10 is live, but we heard of it before it heard of us; a
        // straggler of a dead life, 11, replaces it.
        assert_eq!(p.check_epoch(0, 10, Unknown, LIMITS), EpochCheck::First);
        assert_eq!(p.check_epoch(1, 11, Earlier, LIMITS), EpochCheck::Restarted);
        // 10 now vouches for us, and 11 never did: 10 comes back at once.
        assert_eq!(p.check_epoch(2, 10, Us, LIMITS), EpochCheck::Restarted);
        assert_eq!(p.epoch, 10);
        // A dead life that had vouched too (12) replaces the live one...
        assert_eq!(p.check_epoch(3, 12, Us, LIMITS), EpochCheck::Restarted);
        // ...which is refused while 12 is heard from,
        assert_eq!(p.check_epoch(4, 12, Us, LIMITS), EpochCheck::Current);
        assert_eq!(p.check_epoch(5, 10, Us, LIMITS), EpochCheck::Retired);
        let quiet = 4 + LIMITS.silence_us;
        assert_eq!(
            p.check_epoch(quiet - 1, 10, Us, LIMITS),
            EpochCheck::Retired
        );
        // and comes back once 12 has been silent for epoch_silence_ms.
        assert_eq!(p.check_epoch(quiet, 10, Us, LIMITS), EpochCheck::Restarted);
        // One that does not vouch does not.
        assert_eq!(
            p.check_epoch(quiet + LIMITS.silence_us, 12, Unknown, LIMITS),
            EpochCheck::Retired
        );
    }

    #[test]
    fn rtt_from_echo_ignores_stale_echoes() {
        let mut p = Peer::new(2);
        p.on_header(
            1_000,
            0,
            Some(Echo {
                sent_us: 500,
                delay_us: 100,
            }),
        );
        assert_eq!(p.stats.rtt_us, 400);
        // The same echo again (a replay) gives no sample.
        p.on_header(
            9_000,
            0,
            Some(Echo {
                sent_us: 500,
                delay_us: 100,
            }),
        );
        assert_eq!(p.stats.rtt_samples, 1);
        p.on_header(
            10_000,
            0,
            Some(Echo {
                sent_us: 9_500,
                delay_us: 100,
            }),
        );
        assert_eq!(p.stats.rtt_samples, 2);
        assert_eq!(p.stats.rtt_us, (7 * 400 + 400) / 8);
        assert_eq!(p.nack_repeat_us(4_000), 4_000);
    }

    fn sample(p: &mut Peer, now_us: u64, rtt_us: u32) {
        p.on_header(
            now_us,
            0,
            Some(Echo {
                sent_us: now_us as u32 - rtt_us,
                delay_us: 0,
            }),
        );
    }

    #[test]
    fn reorder_window_follows_the_minimum_rtt_within_bounds() {
        let mut p = Peer::new(2);
        // Nothing known: the most cautious wait.
        assert_eq!(p.reorder_window_us(100, 500), 500);
        sample(&mut p, 10_000, 1_200);
        assert_eq!(p.reorder_window_us(100, 500), 300);
        // A queue builds: srtt grows, the minimum (and the window) does not.
        for i in 1..20 {
            sample(&mut p, 10_000 + i * 1_000, 900 + 1_000 * i as u32 / 10);
        }
        assert_eq!(p.stats.rtt_min_us, 900 + 100);
        assert!(p.stats.rtt_us > 1_500);
        assert_eq!(p.reorder_window_us(100, 500), 250);
        // Fast paths hit the floor, slow ones the ceiling.
        sample(&mut p, 40_000, 80);
        assert_eq!(p.reorder_window_us(100, 500), 100);
        // An old minimum expires: the path became slower.
        sample(&mut p, 40_000 + RTT_MIN_WINDOW_US, 8_000);
        assert_eq!(p.stats.rtt_min_us, 8_000);
        assert_eq!(p.reorder_window_us(100, 500), 500);
    }

    #[test]
    fn probe_waits_for_the_rto_and_the_ack_delay() {
        let mut p = Peer::new(2);
        assert_eq!(p.probe_after_us(5_000, 200), 5_000);
        sample(&mut p, 100_000, 20_000);
        // srtt 20 ms, rttvar 10 ms: RTO 60 ms, plus the ack delay.
        assert_eq!(p.rto_us(), 60_000);
        assert_eq!(p.probe_after_us(5_000, 200), 60_200);
        assert_eq!(p.nack_repeat_us(4_000), 60_000);
    }
}
