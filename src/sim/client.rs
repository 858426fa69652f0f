//! Simulated clients: each proposes unique values to the node it believes
//! leads its group, waits for the outcome, and follows redirects. An append
//! is confirmed when the production replica answers it with the index it
//! was applied at; the checker then holds the cluster to it forever.

use super::checker::Violation;
use super::glue::Answer;
use super::trace::What;
use super::world::{idx, Event, World};
use crate::consensus::Index;
use crate::node::ProposeError;
use rand::Rng;

/// How one client operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Confirmed at this index.
    Ok(Index),
    /// Definitely not applied: refused, or another entry took its index.
    Failed,
    /// The client cannot tell (its node crashed or it timed out).
    Unknown,
}

/// One client operation in the recorded history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    /// Client that invoked it.
    pub client: usize,
    /// Group it went to.
    pub group: usize,
    /// The unique value appended.
    pub value: Vec<u8>,
    /// When it was invoked and when its outcome was known, simulated ms.
    pub invoked_ms: u64,
    /// When the outcome was known.
    pub completed_ms: u64,
    /// The outcome.
    pub outcome: Outcome,
}

/// A proposal waiting for its outcome.
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    node: usize,
    /// The operation id its answer names.
    op: u64,
    value: Vec<u8>,
    invoked_ms: u64,
}

/// One client of one group.
#[derive(Clone, Debug)]
pub(crate) struct Client {
    id: usize,
    pub(crate) group: usize,
    /// Node it will try next.
    guess: usize,
    pub(crate) sent: u64,
    /// Bumped at every state change so stale timer events are ignored.
    generation: u64,
    pending: Option<Pending>,
}

/// How long a client waits before giving an append up as unknown.
const CLIENT_TIMEOUT_MS: u64 = 2_000;

impl Client {
    pub(crate) fn new(id: usize, group: usize, guess: usize) -> Self {
        Client {
            id,
            group,
            guess,
            sent: 0,
            generation: 0,
            pending: None,
        }
    }
}

impl World {
    fn client_later(&mut self, c: usize, delay_ms: u64) {
        self.clients[c].generation += 1;
        let generation = self.clients[c].generation;
        self.schedule(
            self.now + delay_ms,
            Event::Client {
                client: c,
                generation,
            },
        );
    }

    pub(crate) fn client_event(&mut self, c: usize, generation: u64) -> Result<(), Violation> {
        if self.clients[c].generation != generation {
            return Ok(());
        }
        if let Some(p) = self.clients[c].pending.take() {
            // Timed out: the outcome is unknown to this client.
            self.complete(c, p, Outcome::Unknown);
            let think = self.rng.gen_range(1..=20);
            self.client_later(c, think);
            return Ok(());
        }
        let (g, n) = (self.clients[c].group, self.clients[c].guess);
        let live = self.nodes[n].runs(g);
        if !live {
            self.clients[c].guess = self.rng.gen_range(0..self.nodes.len());
            self.client_later(c, 10);
            return Ok(());
        }
        let cl = &mut self.clients[c];
        cl.sent += 1;
        let value = format!("g{}c{}#{}", cl.group, cl.id, cl.sent).into_bytes();
        let op = self.propose_hosted(c, n, value.clone());
        self.clients[c].pending = Some(Pending {
            node: n,
            op,
            value,
            invoked_ms: self.now,
        });
        self.client_later(c, CLIENT_TIMEOUT_MS);
        self.drive(n, g)
    }

    /// Not the leader: try the one named (or any node), after a backoff.
    fn redirect(&mut self, c: usize, leader: Option<crate::consensus::NodeId>) {
        let guess = match leader {
            Some(l) => idx(l),
            None => self.rng.gen_range(0..self.nodes.len()),
        };
        self.clients[c].guess = guess;
        let backoff = self.rng.gen_range(2..=15);
        self.client_later(c, backoff);
    }

    /// A production replica answered a client's append.
    pub(crate) fn client_answered(&mut self, a: Answer) -> Result<(), Violation> {
        let c = a.client;
        if self.clients[c]
            .pending
            .as_ref()
            .is_none_or(|p| p.op != a.op)
        {
            return Ok(()); // given up on already
        }
        let p = self.clients[c].pending.take().expect("checked");
        let g = self.clients[c].group;
        match a.result {
            Ok(index) => {
                self.record(p.node, g, What::Confirm { index });
                if self.healed_at.is_some_and(|t| p.invoked_ms >= t) {
                    self.recovered[g] = true;
                }
                let Some(h) = self.checker.chain_at(g, index) else {
                    return Err(Violation {
                        invariant: "state-machine-safety",
                        detail: format!(
                            "group {g}: an append was confirmed at {index}, which no node applied"
                        ),
                    });
                };
                self.complete(c, p, Outcome::Ok(index));
                let disks = super::world::durables(&self.nodes, g);
                self.checker.confirmed(g, index, h, &disks)?;
                let think = self.rng.gen_range(0..=10);
                self.client_later(c, think);
            }
            // Refused before it was proposed: nothing to record.
            Err(ProposeError::NotLeader(leader)) => self.redirect(c, leader),
            Err(ProposeError::Lost) => {
                // Another leader's entry took its index: a definite failure.
                self.complete(c, p, Outcome::Failed);
                let think = self.rng.gen_range(0..=10);
                self.client_later(c, think);
            }
            Err(ProposeError::LogStopped(_)) => {
                self.complete(c, p, Outcome::Unknown);
                let retry = self.rng.gen_range(5..=30);
                self.client_later(c, retry);
            }
            Err(_) => {
                // Refused before it was proposed (busy, full, too large).
                let backoff = self.rng.gen_range(5..=30);
                self.client_later(c, backoff);
            }
        }
        Ok(())
    }

    fn complete(&mut self, c: usize, p: Pending, outcome: Outcome) {
        self.history.push(Operation {
            client: c,
            group: self.clients[c].group,
            value: p.value,
            invoked_ms: p.invoked_ms,
            completed_ms: self.now,
            outcome,
        });
    }

    /// Clients waiting on a replica that crashed will never hear back.
    pub(crate) fn abandon_clients_on(&mut self, n: usize, g: usize) {
        for c in 0..self.clients.len() {
            let hit = self.clients[c]
                .pending
                .as_ref()
                .is_some_and(|p| p.node == n && self.clients[c].group == g);
            if hit {
                let p = self.clients[c].pending.take().expect("checked");
                self.complete(c, p, Outcome::Unknown);
                let retry = self.rng.gen_range(5..=30);
                self.client_later(c, retry);
            }
        }
    }
}
