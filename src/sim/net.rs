//! The simulated network between nodes: per-direction blocking (symmetric
//! and one-way partitions), loss, duplication, and delay with jitter (which
//! reorders). Delivery times are scheduled by the world; the rules that
//! choose them ([`World::path_arrivals`]) are one function for a Raft
//! message (`Net::Direct`) and for a datagram (`Net::Endpoint`).

use super::world::World;
use rand::Rng;

/// Link state between every ordered pair of nodes.
pub(crate) struct Network {
    nodes: usize,
    /// blocked[from * nodes + to]
    blocked: Vec<bool>,
    /// Probability that a message is lost.
    pub(crate) loss: f64,
    /// Probability that a message is delivered twice.
    pub(crate) duplication: f64,
    /// clogged_until_ms[from * nodes + to]: the path holds every message
    /// until then (a congested switch port, TigerBeetle's "clogging").
    clogged_until_ms: Vec<u64>,
}

impl Network {
    pub(crate) fn new(nodes: usize) -> Self {
        Network {
            nodes,
            blocked: vec![false; nodes * nodes],
            loss: 0.0,
            duplication: 0.0,
            clogged_until_ms: vec![0; nodes * nodes],
        }
    }

    /// True if messages from `from` to `to` (node indexes) are dropped.
    pub(crate) fn is_blocked(&self, from: usize, to: usize) -> bool {
        self.blocked[from * self.nodes + to]
    }

    /// Cuts `node` off from everyone, both ways.
    pub(crate) fn isolate(&mut self, node: usize) {
        for other in 0..self.nodes {
            if other != node {
                self.blocked[node * self.nodes + other] = true;
                self.blocked[other * self.nodes + node] = true;
            }
        }
    }

    /// Cuts the direction `from` -> `to` only.
    pub(crate) fn cut_one_way(&mut self, from: usize, to: usize) {
        self.blocked[from * self.nodes + to] = true;
    }

    /// Holds every message from `from` to `to` until `until_ms`.
    pub(crate) fn clog(&mut self, from: usize, to: usize, until_ms: u64) {
        self.clogged_until_ms[from * self.nodes + to] = until_ms;
    }

    /// Earliest delivery time on the path `from` -> `to`.
    pub(crate) fn clogged_until(&self, from: usize, to: usize) -> u64 {
        self.clogged_until_ms[from * self.nodes + to]
    }

    /// Restores every link.
    pub(crate) fn heal(&mut self) {
        self.blocked.iter_mut().for_each(|b| *b = false);
        self.clogged_until_ms.iter_mut().for_each(|t| *t = 0);
    }
}

/// When the copies of one packet arrive: none if it was blocked or lost,
/// two if the network duplicated it.
pub(crate) struct Arrivals {
    at_ms: [u64; 2],
    copies: usize,
}

impl Arrivals {
    /// The arrival times, one per copy (empty if the packet was dropped).
    pub(crate) fn times(&self) -> &[u64] {
        &self.at_ms[..self.copies]
    }
}

impl World {
    /// Draws what the network does to one packet sent now from `from` to
    /// `to` (node indexes): blocked or lost, duplicated, each copy delayed
    /// by the base delay, jitter (which reorders) and now and then a clog,
    /// and held while the path is clogged. The draws are made in this
    /// order for every packet, so a seed's run does not depend on who
    /// calls it.
    pub(crate) fn path_arrivals(&mut self, from: usize, to: usize) -> Arrivals {
        let mut a = Arrivals {
            at_ms: [0; 2],
            copies: 0,
        };
        if self.net.is_blocked(from, to) || self.rng.gen_bool(self.net.loss) {
            return a;
        }
        a.copies = if self.rng.gen_bool(self.net.duplication) {
            2
        } else {
            1
        };
        for at in &mut a.at_ms[..a.copies] {
            let mut delay = self.p.net_delay_min_ms + self.rng.gen_range(0..=self.p.net_jitter_ms);
            if self.rng.gen_bool(self.p.net_clog_probability) {
                delay += self.rng.gen_range(0..=2 * self.p.election_timeout_ms);
            }
            *at = (self.now + delay).max(self.net.clogged_until(from, to) + delay);
        }
        a
    }
}
