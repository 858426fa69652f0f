//! Inputs from the failure detector (`src/heartbeat/`): what the serial
//! heartbeat and the per-channel timers learn about peers, turned into
//! Raft actions. None of them can break safety: they only move timers,
//! drop a lease, adopt a higher term (as any message carrying it would) or
//! step a leader down. Liveness is what they buy:
//! - a leader known dead is replaced after a short random delay instead of
//!   a whole election timeout (fast failover);
//! - a leader seen alive over serial, with a quorum, is not disrupted just
//!   because this follower's IP path to it broke;
//! - a leader learns of a newer term, or of its own stalled disk, at once.

use super::{NodeId, Raft, Role, Term};
use rand::Rng;

impl Raft {
    /// The detector declares `peer` down: every channel to it has been
    /// silent for the deadtime. If it is this node's leader (or this node
    /// knows no leader), the lease on it is dropped (so this node grants votes to others that saw it die
    /// too) and this node campaigns soon, not after a whole election
    /// timeout: after `rank * j + random(0..j/2)` ms, with `j` =
    /// `fast_campaign_jitter_ms` (set it to a few round trips) and `rank` this node's place among the
    /// voters counted on from the dead leader's id. Every follower's
    /// detector fires at about the same time, so a purely random delay as
    /// short as this would split the vote whenever messages take longer
    /// than the spread; staggered by rank, the first candidate's vote
    /// request reaches the others before their own turn. Pre-vote still
    /// applies: the campaign wins only if a majority agrees the leader is
    /// gone.
    pub fn peer_down(&mut self, now_ms: u64, peer: NodeId) {
        self.now_ms = self.now_ms.max(now_ms);
        // Also when leaderless: an election that split while the leader's
        // death was still unconfirmed is retried in rank order too.
        if self.role == Role::Leader || self.leader.is_some_and(|l| l != peer) {
            return;
        }
        if self.role == Role::PreCandidate {
            // Its own timer fired first, before the detector spoke: its
            // pre-vote is off the rank order, and granted it would collide
            // with the rank-0 node's campaign (a split vote costs a whole
            // election timeout). It waits for its rank like the others.
            // Only a pre-vote is given up: a candidate has voted already.
            self.become_follower(self.term, None);
        }
        self.leader = None;
        self.leader_contact_ms = None;
        self.stats.fast_campaigns += 1;
        let jitter = self.cfg.fast_campaign_jitter_ms.max(1);
        let voters = &self.membership().voters;
        let rank = voters
            .iter()
            .filter(|&&v| v != peer && v != self.id)
            .filter(|&&v| v.wrapping_sub(peer) < self.id.wrapping_sub(peer))
            .count() as u64;
        // Random within the first half of the rank's slot, so that two
        // ranks are always at least half a slot apart.
        let at = self.now_ms + rank * jitter + self.rng.gen_range(0..jitter.div_ceil(2));
        // Set, not lowered: a node whose own timer would fire earlier waits
        // for its rank too, or it could collide with the rank before it.
        self.election_deadline_ms = at;
    }

    /// The serial heartbeat shows `leader` leading `term` while it reports
    /// a live quorum, though this node may not hear it over IP: keep
    /// following it and do not campaign (the IP path broke, not the
    /// leader). A higher term is adopted first, as a message would.
    pub fn leader_seen_out_of_band(&mut self, now_ms: u64, leader: NodeId, term: Term) {
        self.now_ms = self.now_ms.max(now_ms);
        if leader == self.id {
            return;
        }
        self.observe_term(now_ms, term);
        if term != self.term || self.role == Role::Leader {
            return;
        }
        if self.leader.is_some_and(|l| l != leader) {
            return; // two claims for one term cannot both be true; ignore
        }
        if self.role != Role::Follower {
            // A (pre-)candidate of this term that learns of the leader
            // follows it, as it would on its heartbeat.
            self.become_follower(term, Some(leader));
        }
        self.leader = Some(leader);
        self.leader_contact_ms = Some(self.now_ms);
        self.stats.out_of_band_leader_contacts += 1;
        self.reset_election_deadline();
    }

    /// A term learnt out of band (the serial heartbeat): a higher one is
    /// adopted at once, so a deposed leader stops leading and serving
    /// reads without waiting for an IP message to reach it.
    pub fn observe_term(&mut self, now_ms: u64, term: Term) {
        self.now_ms = self.now_ms.max(now_ms);
        if term > self.term {
            if self.role == Role::Leader {
                self.stats.out_of_band_step_downs += 1;
            }
            self.become_follower(term, None);
        }
    }
}
