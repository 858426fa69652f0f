//! Replay protection for one peer's heartbeats: a recording of authentic
//! frames played back onto a cut line must not make a dead peer look alive.
//!
//! A heartbeat is fresh if it carries the peer's current epoch and a
//! higher sequence number than any seen, or a new epoch (the peer
//! restarted) that is not one of its last [`RETIRED_EPOCHS`] epochs. Same
//! rule and same limit as the transport's sessions: a recording older than
//! that many restarts of the peer is taken as a restart once, and the
//! real peer's next heartbeat (of an epoch now retired) is then refused
//! until it restarts. That needs physical access to the cable, where
//! cutting it does the same harm; it never produces a false `up` for more
//! than the one replayed frame's deadtime.

use super::message::Heartbeat;

/// Earlier epochs of a peer remembered, so their frames stay refused.
pub const RETIRED_EPOCHS: usize = 8;

/// What [`ReplayGuard::check`] concluded about a heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freshness {
    /// Next in the current epoch (possibly after a gap: lost frames).
    Fresh,
    /// The first heartbeat of a new epoch: the peer started or restarted.
    Restarted,
    /// A sequence number already seen, or a retired epoch: drop it.
    Stale,
}

/// The sequence state of one peer's heartbeats.
#[derive(Clone, Debug, Default)]
pub struct ReplayGuard {
    epoch: u64,
    seq: u64,
    retired: [u64; RETIRED_EPOCHS],
    retired_next: usize,
    /// Heartbeats refused as stale.
    pub stale_dropped: u64,
    /// New epochs seen (the first one included).
    pub restarts_seen: u64,
}

impl ReplayGuard {
    /// A guard that has seen nothing yet.
    pub fn new() -> Self {
        ReplayGuard::default()
    }

    /// Classifies `hb` and, unless it is stale, records it as the latest.
    #[must_use = "a stale or replayed heartbeat must be dropped"]
    pub fn check(&mut self, hb: &Heartbeat) -> Freshness {
        // Decoded heartbeats never carry epoch or seq 0 (message.rs).
        if hb.epoch == self.epoch {
            if hb.seq > self.seq {
                self.seq = hb.seq;
                return Freshness::Fresh;
            }
            self.stale_dropped += 1;
            return Freshness::Stale;
        }
        if hb.epoch == 0 || self.retired.contains(&hb.epoch) {
            self.stale_dropped += 1;
            return Freshness::Stale;
        }
        if self.epoch != 0 {
            self.retired[self.retired_next] = self.epoch;
            self.retired_next = (self.retired_next + 1) % RETIRED_EPOCHS;
        }
        self.epoch = hb.epoch;
        self.seq = hb.seq;
        self.restarts_seen += 1;
        Freshness::Restarted
    }

    /// The peer's current epoch and highest sequence number (0, 0: none).
    pub fn latest(&self) -> (u64, u64) {
        (self.epoch, self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hb(epoch: u64, seq: u64) -> Heartbeat {
        Heartbeat::new(2, epoch, seq)
    }

    #[test]
    fn sequence_within_an_epoch() {
        let mut g = ReplayGuard::new();
        assert_eq!(g.check(&hb(10, 1)), Freshness::Restarted);
        assert_eq!(g.check(&hb(10, 2)), Freshness::Fresh);
        assert_eq!(
            g.check(&hb(10, 5)),
            Freshness::Fresh,
            "a gap is lost frames, not a replay"
        );
        assert_eq!(g.check(&hb(10, 5)), Freshness::Stale);
        assert_eq!(g.check(&hb(10, 3)), Freshness::Stale);
        assert_eq!(g.latest(), (10, 5));
        assert_eq!(g.stale_dropped, 2);
    }

    #[test]
    fn old_epochs_stay_refused() {
        let mut g = ReplayGuard::new();
        for e in 1..=RETIRED_EPOCHS as u64 + 1 {
            assert_eq!(g.check(&hb(e, 1)), Freshness::Restarted);
            assert_eq!(g.check(&hb(e, 2)), Freshness::Fresh);
        }
        for e in 2..=RETIRED_EPOCHS as u64 {
            assert_eq!(g.check(&hb(e, 100)), Freshness::Stale, "epoch {e}");
        }
        assert_eq!(g.restarts_seen, RETIRED_EPOCHS as u64 + 1);
        assert_eq!(g.check(&hb(0, 1)), Freshness::Stale);
    }
}
