//! The simulated network between nodes: per-direction blocking (symmetric
//! and one-way partitions), loss, duplication, and delay with jitter (which
//! reorders). Delivery times are scheduled by the world.

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
