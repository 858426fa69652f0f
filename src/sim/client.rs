//! Simulated log clients: each appends unique values to its group through
//! the production client's retry policy (`client::retry::Attempts` and
//! `Leaders`), over the client protocol's sessions (`sim::pipe`), served
//! as the production server serves (`node::client::dispatch`). A call keeps its (client id, seq) on every
//! try, across redirects, lost answers and crashes, so the replicas'
//! dedup table and the answers it routes are checked end to end. An
//! append is confirmed when a replica answers it with an index; the
//! checker then holds the cluster to it forever.

use super::checker::Violation;
use super::trace::What;
use super::world::{Event, World};
use crate::api::{Request, Response};
use crate::client::retry::{Attempts, CallError, Leaders, Verdict};
use crate::client::ClientError;
use crate::consensus::Index;
use rand::Rng;

/// How one client operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Confirmed at this index.
    Ok(Index),
    /// Definitely not applied: refused for good.
    Failed,
    /// The client cannot tell (it gave up without an answer).
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

/// One call in progress, across all its tries.
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    attempts: Attempts,
    value: Vec<u8>,
    invoked_ms: u64,
    /// The try waiting for its answer: the node it went to, the
    /// connection and the request id its answer names.
    in_flight: Option<(usize, u64, u64)>,
}

/// One client of one group.
#[derive(Debug)]
pub(crate) struct Client {
    id: usize,
    pub(crate) group: usize,
    /// What it learned of the cluster, as the production client keeps it.
    pub(crate) leaders: Leaders,
    /// Its open connection to each node.
    pub(crate) conns: std::collections::BTreeMap<usize, super::pipe::Conn>,
    pub(crate) sent: u64,
    /// Bumped at every state change so stale timer events are ignored.
    generation: u64,
    pending: Option<Pending>,
}

/// What the log clients saw, for the run's report.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ClientCounts {
    /// Tries sent after a call's first (same client id and seq).
    pub(crate) retries: u64,
    /// Confirms checked against where the read path serves them.
    pub(crate) confirms_checked: u64,
    /// Confirms whose (client id, seq) no replica had served yet.
    pub(crate) confirms_unchecked: u64,
}

/// How long a call keeps trying before the client gives it up as unknown.
const CALL_TIMEOUT_MS: u64 = 4_000;
/// How long one try waits for its answer before the client takes the
/// connection for lost and tries again (a socket's read timeout).
const TRY_TIMEOUT_MS: u64 = 1_000;

impl Client {
    pub(crate) fn new(id: usize, group: usize, nodes: usize) -> Self {
        let mut leaders = Leaders::new(nodes);
        // Address i is node i + 1, as each node's HelloOk would say.
        for n in 0..nodes {
            leaders.connected(n, n as u64 + 1);
        }
        Client {
            id,
            group,
            leaders,
            conns: Default::default(),
            sent: 0,
            generation: 0,
            pending: None,
        }
    }

    /// The client id its appends carry.
    pub(crate) fn client_id(&self) -> u64 {
        self.id as u64 + 1
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
        let now = self.now;
        let cl = &mut self.clients[c];
        let verdict = match cl.pending.as_mut() {
            None => {
                cl.sent += 1;
                let value = format!("g{}c{}#{}", cl.group, cl.id, cl.sent).into_bytes();
                let request = Request::Append {
                    group: cl.group as u32,
                    client_id: cl.client_id(),
                    seq: cl.sent,
                    data: value.clone().into(),
                };
                let mut attempts = Attempts::new(cl.group as u32, request, now, CALL_TIMEOUT_MS);
                let v = attempts.next(now, &cl.leaders);
                cl.pending = Some(Pending {
                    attempts,
                    value,
                    invoked_ms: now,
                    in_flight: None,
                });
                v
            }
            Some(p) => match p.in_flight.take() {
                // The try's answer never came, or its connection closed.
                Some((addr, _, _)) => p.attempts.answered(
                    now,
                    &mut cl.leaders,
                    addr,
                    Err(CallError::Lost("no answer".into())),
                ),
                // A backoff is over.
                None => p.attempts.next(now, &cl.leaders),
            },
        };
        self.carry_out(c, verdict)
    }

    /// Does what the retry policy said.
    fn carry_out(&mut self, c: usize, verdict: Verdict) -> Result<(), Violation> {
        match verdict {
            Verdict::Send(addr) => self.send_try(c, addr),
            Verdict::RetryAfter { ms } => {
                self.client_later(c, ms);
                Ok(())
            }
            Verdict::Done(Response::Appended { index }) => {
                let (n, _, _) = self.clients[c]
                    .pending
                    .as_ref()
                    .and_then(|p| p.in_flight)
                    .expect("answered by the try in flight");
                self.confirm(c, n, index)
            }
            Verdict::Done(other) => panic!("an append answered with {other:?}"),
            Verdict::Fail(e) => {
                let p = self.clients[c].pending.take().expect("a call");
                // A refusal for good (too large, unknown group) was never
                // applied; anything else may have been.
                let outcome = match e {
                    ClientError::Refused(code, _) if code != crate::api::ErrorCode::Conflict => {
                        Outcome::Failed
                    }
                    _ => Outcome::Unknown,
                };
                self.complete(c, p, outcome);
                let think = self.rng.gen_range(1..=20);
                self.client_later(c, think);
                Ok(())
            }
        }
    }

    /// Sends the call's request to node `n` on the client's connection.
    fn send_try(&mut self, c: usize, n: usize) -> Result<(), Violation> {
        let g = self.clients[c].group;
        let p = self.clients[c].pending.as_mut().expect("a call");
        if p.attempts.sent() > 1 {
            self.client_counts.retries += 1;
        }
        let request = p.attempts.request().clone();
        let written = if self.nodes[n].runs(g) {
            self.write_request(super::pipe::Caller::Log(c), n, &request)
        } else {
            self.clients[c].conns.remove(&n);
            None
        };
        let Some((conn, id)) = written else {
            // Nothing listens there: the connection fails after a round trip.
            let p = self.clients[c].pending.as_mut().expect("a call");
            p.in_flight = Some((n, 0, 0));
            let refused_ms = self.rng.gen_range(1..=5);
            self.client_later(c, refused_ms);
            return Ok(());
        };
        let p = self.clients[c].pending.as_mut().expect("a call");
        p.in_flight = Some((n, conn, id));
        self.client_later(c, TRY_TIMEOUT_MS);
        Ok(())
    }

    /// Request `id` on client `c`'s connection `conn` to node `n` was
    /// answered (or its exchange failed).
    pub(crate) fn client_answered(
        &mut self,
        c: usize,
        n: usize,
        conn: u64,
        id: u64,
        r: Result<Response, CallError>,
    ) -> Result<(), Violation> {
        let now = self.now;
        let cl = &mut self.clients[c];
        let Some(p) = cl.pending.as_mut() else {
            return Ok(());
        };
        if p.in_flight != Some((n, conn, id)) {
            return Ok(()); // a try given up on already
        }
        let verdict = p.attempts.answered(now, &mut cl.leaders, n, r);
        if !matches!(verdict, Verdict::Done(_)) {
            self.clients[c].pending.as_mut().expect("a call").in_flight = None;
        }
        self.carry_out(c, verdict)
    }

    /// Client `c`'s connection `conn` to node `n` failed: its try in
    /// flight there, if any, is lost.
    pub(crate) fn connection_lost(
        &mut self,
        c: usize,
        n: usize,
        conn: u64,
        e: CallError,
    ) -> Result<(), Violation> {
        let Some((node, k, id)) = self.clients[c].pending.as_ref().and_then(|p| p.in_flight) else {
            return Ok(());
        };
        if (node, k) != (n, conn) {
            return Ok(());
        }
        self.client_answered(c, n, conn, id, Err(e))
    }

    /// Node `n` answered the call `Appended { index }`.
    fn confirm(&mut self, c: usize, n: usize, index: Index) -> Result<(), Violation> {
        let p = self.clients[c].pending.take().expect("a call");
        let g = self.clients[c].group;
        self.record(n, g, What::Confirm { index });
        if self.healed_at.is_some_and(|t| p.invoked_ms >= t) {
            self.recovered[g] = true;
        }
        // The answer is a record's address; the log checks are per entry.
        let entry = crate::state::dedup::address_index(index);
        let Some(h) = self.checker.chain_at(g, entry) else {
            return Err(Violation {
                invariant: "state-machine-safety",
                detail: format!(
                    "group {g}: an append was confirmed at {index}, which no node applied"
                ),
            });
        };
        let Request::Append { client_id, seq, .. } = *p.attempts.request() else {
            unreachable!("log clients only append")
        };
        if self.checker.appends.confirmed(g, client_id, seq, index)? {
            self.client_counts.confirms_checked += 1;
        } else {
            self.client_counts.confirms_unchecked += 1;
        }
        self.complete(c, p, Outcome::Ok(index));
        let disks = super::world::durables(&self.nodes, g);
        self.checker.confirmed(g, entry, h, &disks)?;
        let think = self.rng.gen_range(0..=10);
        self.client_later(c, think);
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

    /// A crash closes the connections to the replica, and what was on its
    /// way in them is lost: their clients learn it a round trip later, as
    /// a lost try.
    pub(crate) fn abandon_clients_on(&mut self, n: usize, g: usize) {
        for c in 0..self.clients.len() {
            if self.clients[c].group != g {
                continue;
            }
            self.clients[c].conns.remove(&n);
            let hit = self.clients[c]
                .pending
                .as_ref()
                .and_then(|p| p.in_flight)
                .is_some_and(|(node, _, _)| node == n);
            if hit {
                let closed_ms = self.rng.gen_range(1..=5);
                self.client_later(c, closed_ms);
            }
        }
    }
}
