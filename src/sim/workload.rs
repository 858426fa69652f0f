//! The state-machine workloads: simulated ledger and queue clients that
//! speak the client protocol as the production client library does
//! (`client::state`): each operation is one `api::Request` (a [`Command`]
//! with the client's id and a fresh seq, a produce deduplicated by its
//! producer and seq instead; a ledger's metadata or entries as a query
//! that does not wait) written on the client's session to one node
//! (`sim::pipe`), served there as the daemon serves it
//! (`node::client::dispatch`, through the log or at the leader's read
//! index), and the `api::Response` read back is what the client records.
//! Every invocation and completion is recorded, with its simulated time,
//! for the history checkers of `ledger_check` and `queue_check`. One try
//! per operation: an answer lost with its connection, its node or its
//! time is unknown.
//!
//! The planted workload bugs ([`WorkloadBug`]) live in the replica
//! (`node::replica::planted`), set only by the simulator.

use super::checker::Violation;
use super::pipe::{Caller, Conns};
use super::world::{idx, Event, World};
use crate::api::{ErrorCode, Request, Response};
use crate::state::{Answer, Command, Outcome, Query};

pub use crate::node::replica::tap::WorkloadBug;
use rand::Rng;
use std::collections::{BTreeMap, HashMap};

/// What the simulated clients do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Workload {
    /// Append unique raw values to the log (the original workload).
    #[default]
    Log,
    /// Ledgers: create, add, set LAC, close, recover, read.
    Ledger,
    /// Queues: idempotent produce with retries, consume, ack.
    Queue,
}

impl Workload {
    /// Every workload by its command-line name.
    pub const ALL: [(&'static str, Workload); 3] = [
        ("log", Workload::Log),
        ("ledger", Workload::Ledger),
        ("queue", Workload::Queue),
    ];

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, w)| *w == self)
            .map(|(n, _)| *n)
            .expect("every workload is named")
    }

    /// The workload with this command-line name.
    pub fn by_name(name: &str) -> Option<Workload> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|(_, w)| *w)
    }
}

impl WorkloadBug {
    /// The workload a bug shows up in.
    pub fn workload(self) -> Workload {
        match self {
            WorkloadBug::LedgerNoFence
            | WorkloadBug::StaleLac
            | WorkloadBug::SnapshotWithoutMachine
            | WorkloadBug::LedgerAddsReordered => Workload::Ledger,
            WorkloadBug::AckNotReplicated
            | WorkloadBug::ProduceNoDedup
            | WorkloadBug::DedupIgnoresProducer
            | WorkloadBug::SnapshotWithoutEntries
            | WorkloadBug::RepairUnverified
            | WorkloadBug::AckBatchCutShort => Workload::Queue,
        }
    }
}

/// What a state-machine client asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateRequest {
    /// A command, through the log.
    Command(Command),
    /// A ledger's LAC, read at the leader's read index.
    ReadLac {
        /// The ledger's id.
        ledger: u64,
    },
    /// A ledger's entries `from..=to`, read at the leader's read index.
    ReadEntries {
        /// The ledger's id.
        ledger: u64,
        /// First entry id.
        from: u64,
        /// Last entry id wanted.
        to: u64,
    },
}

/// What a state-machine client was answered. A refusal is what the
/// protocol tells a client of it: its `ErrorCode`
/// (`client::dispatch::refusal_code` of the state machine's error).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateResult {
    /// The command was applied with this result.
    Applied(Result<Outcome, ErrorCode>),
    /// The LAC read.
    Lac(Result<Option<u64>, ErrorCode>),
    /// The entries read, as (id, data).
    Entries(Result<Vec<(u64, Vec<u8>)>, ErrorCode>),
    /// The client cannot tell: it timed out, its connection or its node
    /// went, or the node answered `Unavailable` or `Timeout`. A command
    /// may or may not have taken effect.
    Unknown,
}

/// One completed state-machine client operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateOp {
    /// Client that invoked it.
    pub client: usize,
    /// Group it went to.
    pub group: usize,
    /// What it asked.
    pub request: StateRequest,
    /// When it was invoked, simulated ms.
    pub invoked_ms: u64,
    /// When its outcome was known (or given up as unknown).
    pub completed_ms: u64,
    /// What it was answered.
    pub result: StateResult,
}

/// An operation waiting for its answer, across its tries.
#[derive(Clone, Debug)]
struct StatePending {
    request: StateRequest,
    /// What every try sends, built once: the same (client id, seq).
    wire: Request,
    invoked_ms: u64,
    /// When the client gives it up as unknown.
    deadline_ms: u64,
    /// A node answered that it may have been applied: from now on it is
    /// only ever asked again, never dropped as not done.
    maybe_applied: bool,
    /// The try waiting for its answer: the node, the connection and the
    /// request id its answer names; `None` during a backoff.
    in_flight: Option<(usize, u64, u64)>,
    /// A burst: every command sent with this one, this one first (empty:
    /// not a burst).
    burst: Vec<BurstPart>,
}

/// One command of a burst: sent with the others on one connection in one
/// write, without waiting for their answers (as the pipelined client
/// library sends them, so the node gathers them into one command batch
/// entry), each answered on its own. One try each: a retry of one could
/// land after a later one of the burst, which the pipelined client never
/// does; an answer that is not a result leaves it unknown.
#[derive(Clone, Debug)]
struct BurstPart {
    request: StateRequest,
    /// The request id its answer names.
    id: u64,
    result: Option<StateResult>,
}

/// What a state client makes of the answer to its request.
enum Heard {
    /// The operation's result, for the history.
    Result(StateResult),
    /// Not the leader: ask this node next (any node, if none is named).
    Redirect(Option<usize>),
    /// Refused before anything was done (a full disk): ask again later.
    Later,
    /// Refused, but it may have been done (`Unavailable`: lost, stopped,
    /// busy; `Timeout`): the same request again, as the production
    /// client retries it, so the dedup table answers it once.
    Ambiguous,
}

/// A ledger client's own ledger, while it writes it.
#[derive(Clone, Debug)]
struct Writer {
    ledger: u64,
    token: u64,
    adds_left: u32,
    last_added: Option<u64>,
    written: u64,
}

/// What a client does in its workload.
#[derive(Clone, Debug)]
enum Role {
    Ledger {
        /// Reads and recovers others' ledgers, never writes its own.
        reader: bool,
        writer: Option<Writer>,
        /// Highest LAC this client has seen per ledger (to pick read ranges).
        seen_lac: HashMap<u64, u64>,
    },
    Producer {
        ready: bool,
        producer_id: u64,
        seq: u64,
        /// The batch being produced, kept for retries with the same seq.
        batch: Option<Vec<Vec<u8>>>,
    },
    Consumer {
        ready: bool,
        to_ack: Vec<u64>,
    },
}

/// One state-machine client of one group.
#[derive(Debug)]
pub(crate) struct StateClient {
    id: usize,
    group: usize,
    guess: usize,
    generation: u64,
    pending: Option<StatePending>,
    role: Role,
    /// Its open connection to each node.
    conns: Conns,
    /// The seq of its last command (the production client's `next_seq`).
    sent: u64,
}

/// How long a client waits before giving an operation up as unknown.
const STATE_CLIENT_TIMEOUT_MS: u64 = 1_000;
/// Ledger clients per group (a writer and a reader-recoverer at least).
pub(crate) const LEDGER_CLIENTS_PER_GROUP: usize = 3;
/// Queue clients per group: even ids produce, odd ids consume.
pub(crate) const QUEUE_CLIENTS_PER_GROUP: usize = 4;
/// Deliveries before dead-lettering: high, so no message is dead-lettered
/// in a run and every confirmed one must be delivered or acked.
const QUEUE_MAX_DELIVERIES: u32 = 1000;

/// The queue of group `g`.
pub(crate) fn queue_name(g: usize) -> String {
    format!("q{g}")
}

impl StateClient {
    /// Client `id` of `group`, first asking node `guess`; `seed` becomes
    /// a producer's id.
    pub(crate) fn new(
        id: usize,
        group: usize,
        guess: usize,
        workload: Workload,
        seed: u64,
    ) -> Self {
        let role = match workload {
            Workload::Ledger => Role::Ledger {
                reader: id % LEDGER_CLIENTS_PER_GROUP == 0,
                writer: None,
                seen_lac: HashMap::new(),
            },
            _ if id % 2 == 0 => Role::Producer {
                ready: false,
                producer_id: seed,
                seq: 1,
                batch: None,
            },
            _ => Role::Consumer {
                ready: false,
                to_ack: Vec::new(),
            },
        };
        StateClient {
            id,
            group,
            guess,
            generation: 0,
            pending: None,
            role,
            conns: Conns::new(),
            sent: 0,
        }
    }

    /// The group it works on.
    pub(crate) fn group(&self) -> usize {
        self.group
    }

    /// Its open connections, by node.
    pub(crate) fn conns_mut(&mut self) -> &mut Conns {
        &mut self.conns
    }

    /// The client id its commands carry (the log clients' workloads never
    /// share a run with it).
    fn client_id(&self) -> u64 {
        self.id as u64 + 1
    }
}

/// The request the production client (`client::state`) sends for `r`: a
/// command as client `client_id`'s request `seq`, but a produce without
/// a client id (it deduplicates itself by producer and seq); a LAC as the
/// ledger's metadata and entries as a ledger read, neither waiting.
fn wire_request(group: u32, r: &StateRequest, client_id: u64, seq: u64) -> Request {
    let query = |query: Query| Request::Query {
        group,
        wait_ms: 0,
        query: query.encode(),
    };
    match r {
        StateRequest::Command(command) => {
            let (client_id, seq) = match command {
                Command::Produce { seq, .. } => (0, *seq),
                _ => (client_id, seq),
            };
            Request::Command {
                group,
                client_id,
                seq,
                command: command.encode(),
            }
        }
        StateRequest::ReadLac { ledger } => query(Query::Ledger { ledger: *ledger }),
        StateRequest::ReadEntries { ledger, from, to } => query(Query::ReadLedger {
            ledger: *ledger,
            from: *from,
            to: *to,
        }),
    }
}

/// What the answer `resp` to `request` tells its client, as the
/// production client reads it (`client::state`, `client::retry`); an
/// answer of the wrong kind, or one that does not decode, is an error.
fn heard(request: &StateRequest, resp: Response) -> Result<Heard, String> {
    let result = match (request, resp) {
        (StateRequest::Command(_), Response::Outcome { outcome }) => {
            let o = Outcome::decode(&outcome).ok_or("an outcome that does not decode")?;
            StateResult::Applied(Ok(o))
        }
        (StateRequest::ReadLac { .. }, Response::Answer { answer }) => {
            match Answer::decode(&answer) {
                Some(Answer::Ledger(info)) => StateResult::Lac(Ok(info.lac)),
                other => return Err(format!("a LAC read answered {other:?}")),
            }
        }
        (StateRequest::ReadEntries { .. }, Response::Answer { answer }) => {
            match Answer::decode(&answer) {
                Some(Answer::Entries(es)) => {
                    StateResult::Entries(Ok(es.into_iter().map(|e| (e.id, e.data)).collect()))
                }
                other => return Err(format!("a ledger read answered {other:?}")),
            }
        }
        (
            _,
            Response::Error {
                code: ErrorCode::NotLeader,
                leader,
                ..
            },
        ) => return Ok(Heard::Redirect(leader.map(|(l, _)| idx(l)))),
        (_, Response::Error { code, .. }) => match code {
            ErrorCode::DiskFull => return Ok(Heard::Later),
            // Lost, stopped, busy or out of time: it may have been applied.
            ErrorCode::Unavailable | ErrorCode::Timeout => return Ok(Heard::Ambiguous),
            _ => match request {
                StateRequest::Command(_) => StateResult::Applied(Err(code)),
                StateRequest::ReadLac { .. } => StateResult::Lac(Err(code)),
                StateRequest::ReadEntries { .. } => StateResult::Entries(Err(code)),
            },
        },
        (_, other) => return Err(format!("{request:?} answered {other:?}")),
    };
    Ok(Heard::Result(result))
}

impl World {
    fn state_client_later(&mut self, c: usize, delay_ms: u64) {
        self.state_clients[c].generation += 1;
        let generation = self.state_clients[c].generation;
        self.schedule(
            self.now + delay_ms,
            Event::StateClient {
                client: c,
                generation,
            },
        );
    }

    fn state_complete(&mut self, c: usize, mut p: StatePending, result: StateResult) {
        // A burst: each command goes into the history on its own, in the
        // order it was sent; those not answered with `result`.
        if !p.burst.is_empty() {
            for part in std::mem::take(&mut p.burst) {
                let one = StatePending {
                    request: part.request,
                    ..p.clone()
                };
                self.state_complete(c, one, part.result.unwrap_or_else(|| result.clone()));
            }
            return;
        }
        // Liveness, as for raw appends: a command through the log, invoked
        // after healing, was applied and answered.
        let applied = matches!(result, StateResult::Applied(_));
        let g = self.state_clients[c].group;
        if applied && self.healed_at.is_some_and(|t| p.invoked_ms >= t) {
            self.recovered[g] = true;
        }
        self.client_learned(c, &p.request, &result);
        self.state_history.push(StateOp {
            client: c,
            group: g,
            request: p.request,
            invoked_ms: p.invoked_ms,
            completed_ms: self.now,
            result,
        });
        let think = self.rng.gen_range(0..=10);
        self.state_client_later(c, think);
    }

    /// A client's timer fired: give up its operation, or start the next.
    pub(crate) fn state_client_event(
        &mut self,
        c: usize,
        generation: u64,
    ) -> Result<(), Violation> {
        if self.state_clients[c].generation != generation {
            return Ok(());
        }
        let g = self.state_clients[c].group;
        if let Some(p) = self.state_clients[c].pending.as_ref() {
            // Out of time, or a backoff is over.
            if p.in_flight.is_some() || self.now >= p.deadline_ms {
                let p = self.state_clients[c].pending.take().expect("checked");
                self.state_complete(c, p, StateResult::Unknown);
            } else {
                self.state_send(c);
            }
            return Ok(());
        }
        let request = self.next_request(c);
        let read = !matches!(request, StateRequest::Command(_));
        let stale_reads = self.opts.workload_bug == Some(WorkloadBug::StaleLac);
        if read && stale_reads {
            // The planted bug asks any node, which answers from its own
            // state (`node::replica::planted`).
            self.state_clients[c].guess = self.rng.gen_range(0..self.nodes.len());
        }
        let n = self.state_clients[c].guess;
        let live = self.nodes[n].runs(g);
        if !live {
            self.state_clients[c].guess = self.rng.gen_range(0..self.nodes.len());
            self.state_client_later(c, 10);
            return Ok(());
        }
        let now = self.now;
        let requests = self.burst(c, request);
        let cl = &mut self.state_clients[c];
        let wires: Vec<Request> = requests
            .iter()
            .map(|request| {
                if matches!(request, StateRequest::Command(_)) {
                    cl.sent += 1;
                }
                wire_request(g as u32, request, cl.client_id(), cl.sent)
            })
            .collect();
        let mut pending = StatePending {
            request: requests[0].clone(),
            wire: wires[0].clone(),
            invoked_ms: now,
            deadline_ms: now + STATE_CLIENT_TIMEOUT_MS,
            maybe_applied: false,
            in_flight: None,
            burst: Vec::new(),
        };
        if requests.len() == 1 {
            cl.pending = Some(pending);
            self.state_send(c);
            return Ok(());
        }
        let Some((conn, ids)) = self.write_requests(Caller::State(c), n, &wires) else {
            self.state_clients[c].guess = self.rng.gen_range(0..self.nodes.len());
            self.state_client_later(c, 10);
            return Ok(());
        };
        pending.in_flight = Some((n, conn, ids[0]));
        pending.burst = requests
            .into_iter()
            .zip(ids)
            .map(|(request, id)| BurstPart {
                request,
                id,
                result: None,
            })
            .collect();
        self.state_clients[c].pending = Some(pending);
        self.state_client_later(c, STATE_CLIENT_TIMEOUT_MS);
        Ok(())
    }

    /// The commands client `c` sends at once, `request` first: a ledger
    /// writer's adds now and then come two to four at a time, and a
    /// consumer's acks in two parts (the pipelined client library's
    /// bursts, which the node gathers into one command batch entry).
    fn burst(&mut self, c: usize, request: StateRequest) -> Vec<StateRequest> {
        let g = self.state_clients[c].group;
        let id = self.state_clients[c].id;
        let burst = self.rng.gen_bool(0.5);
        let more = self.rng.gen_range(1..=3u32);
        match (&mut self.state_clients[c].role, request) {
            (
                Role::Ledger {
                    writer: Some(w), ..
                },
                StateRequest::Command(add @ Command::AddEntry { .. }),
            ) if burst && w.adds_left >= 2 => {
                let more = more.min(w.adds_left - 1);
                let mut out = vec![StateRequest::Command(add)];
                for _ in 0..more {
                    w.written += 1;
                    out.push(StateRequest::Command(Command::AddEntry {
                        ledger: w.ledger,
                        writer_token: w.token,
                        data: format!("g{g}l{}c{id}#{}", w.ledger, w.written).into_bytes(),
                    }));
                }
                out
            }
            (Role::Consumer { .. }, StateRequest::Command(Command::Ack { queue, ids }))
                if burst && ids.len() >= 2 =>
            {
                let (a, b) = ids.split_at(ids.len() / 2);
                [a, b]
                    .map(|ids| {
                        StateRequest::Command(Command::Ack {
                            queue: queue.clone(),
                            ids: ids.to_vec(),
                        })
                    })
                    .into()
            }
            (_, request) => vec![request],
        }
    }

    /// Node `n` answered request `id` of client `c`'s burst: recorded,
    /// and once every command of it is answered, the burst is complete.
    fn burst_answered(
        &mut self,
        c: usize,
        n: usize,
        conn: u64,
        id: u64,
        resp: Response,
    ) -> Result<(), Violation> {
        let g = self.state_clients[c].group;
        let Some(p) = self.state_clients[c].pending.as_mut() else {
            return Ok(());
        };
        if p.in_flight
            .is_none_or(|(node, k, _)| (node, k) != (n, conn))
        {
            return Ok(());
        }
        let Some(part) = p
            .burst
            .iter_mut()
            .find(|b| b.id == id && b.result.is_none())
        else {
            return Ok(());
        };
        let heard = heard(&part.request, resp).map_err(|why| Violation {
            invariant: "answered-as-asked",
            detail: format!("node {} group {g}: {why}", n + 1),
        })?;
        let redirect = match &heard {
            Heard::Redirect(l) => *l,
            _ => None,
        };
        part.result = Some(match heard {
            Heard::Result(result) => result,
            Heard::Redirect(_) | Heard::Later | Heard::Ambiguous => StateResult::Unknown,
        });
        if let Some(l) = redirect {
            self.state_clients[c].guess = l;
        }
        let p = self.state_clients[c].pending.as_ref().expect("checked");
        if p.burst.iter().all(|b| b.result.is_some()) {
            let p = self.state_clients[c].pending.take().expect("checked");
            self.state_complete(c, p, StateResult::Unknown);
        }
        Ok(())
    }

    /// Writes the operation's request on the client's session to the node
    /// it guesses leads; the answer comes back through the session
    /// (`state_client_answered`). A node that is down is found out a
    /// little later, and another is tried.
    fn state_send(&mut self, c: usize) {
        let (g, n) = (self.state_clients[c].group, self.state_clients[c].guess);
        let p = self.state_clients[c].pending.as_ref().expect("a call");
        let (wire, deadline_ms) = (p.wire.clone(), p.deadline_ms);
        let written = if self.nodes[n].runs(g) {
            self.write_request(Caller::State(c), n, &wire)
        } else {
            None
        };
        let Some((conn, id)) = written else {
            self.state_clients[c].guess = self.rng.gen_range(0..self.nodes.len());
            self.state_client_later(c, 10);
            return;
        };
        let p = self.state_clients[c].pending.as_mut().expect("a call");
        p.in_flight = Some((n, conn, id));
        let wait_ms = deadline_ms.saturating_sub(self.now);
        self.state_client_later(c, wait_ms);
    }

    /// Node `n` answered request `id` on state client `c`'s connection
    /// `conn`: recorded, unless the client gave up on it already.
    pub(crate) fn state_client_answered(
        &mut self,
        c: usize,
        n: usize,
        conn: u64,
        id: u64,
        resp: Response,
    ) -> Result<(), Violation> {
        let burst = self.state_clients[c]
            .pending
            .as_ref()
            .is_some_and(|p| !p.burst.is_empty());
        if burst {
            return self.burst_answered(c, n, conn, id, resp);
        }
        let ours = self.state_clients[c]
            .pending
            .as_ref()
            .is_some_and(|p| p.in_flight == Some((n, conn, id)));
        if !ours {
            return Ok(());
        }
        let g = self.state_clients[c].group;
        let p = self.state_clients[c].pending.as_mut().expect("checked");
        p.in_flight = None;
        let heard = heard(&p.request, resp).map_err(|why| Violation {
            invariant: "answered-as-asked",
            detail: format!("node {} group {g}: {why}", n + 1),
        })?;
        let backoff = match heard {
            Heard::Result(result) => {
                let p = self.state_clients[c].pending.take().expect("checked");
                self.state_complete(c, p, result);
                return Ok(());
            }
            Heard::Redirect(leader) => {
                // A leader that stepped down with the command proposed
                // redirects too (`ProposeError::SteppedDown`): it may
                // still commit, so the same request goes again, as the
                // production client's does.
                if matches!(p.request, StateRequest::Command(_)) {
                    p.maybe_applied = true;
                }
                self.state_clients[c].guess = match leader {
                    Some(l) => l,
                    None => self.rng.gen_range(0..self.nodes.len()),
                };
                self.rng.gen_range(2..=15)
            }
            Heard::Later => self.rng.gen_range(5..=30),
            Heard::Ambiguous => {
                p.maybe_applied = true;
                self.rng.gen_range(5..=30)
            }
        };
        // Refused before it was proposed (or, for a read, before it was
        // answered): nothing to record, unless an earlier try may have
        // been applied; then the same request goes again.
        let p = self.state_clients[c].pending.as_ref().expect("checked");
        if !p.maybe_applied {
            self.state_clients[c].pending = None;
        }
        self.state_client_later(c, backoff);
        Ok(())
    }

    /// State client `c`'s connection `conn` to node `n` failed: its
    /// operation there, if any, is unknown.
    pub(crate) fn state_connection_lost(&mut self, c: usize, n: usize, conn: u64) {
        let hit = self.state_clients[c]
            .pending
            .as_ref()
            .and_then(|p| p.in_flight)
            .is_some_and(|(node, k, _)| (node, k) == (n, conn));
        if hit {
            self.state_call_lost(c, n);
        }
    }

    /// State client `c`'s try at node `n` went with its connection: the
    /// operation is unknown, and the next goes to another node, as the
    /// production client asks around when its leader's connection breaks
    /// (a node that crashes again and again would make every operation
    /// sent to it unknown, even those it only refused).
    fn state_call_lost(&mut self, c: usize, n: usize) {
        let p = self.state_clients[c].pending.take().expect("a call");
        let nodes = self.nodes.len();
        if nodes > 1 {
            self.state_clients[c].guess = (n + self.rng.gen_range(1..nodes)) % nodes;
        }
        self.state_complete(c, p, StateResult::Unknown);
    }

    /// The client's next request, from its role and what it knows.
    fn next_request(&mut self, c: usize) -> StateRequest {
        let (g, id) = (self.state_clients[c].group, self.state_clients[c].id);
        let directory_len = self.ledger_directory[g].len();
        // Recent ledgers are the likeliest to have a live writer.
        let pick = if directory_len == 0 {
            None
        } else {
            let back = self.rng.gen_range(0..directory_len.min(4));
            Some(self.ledger_directory[g][directory_len - 1 - back])
        };
        let roll: f64 = self.rng.gen();
        let token: u64 = self.rng.gen();
        let span = self.rng.gen_range(0..=6u64);
        let batch_len = self.rng.gen_range(1..=3usize);
        let consume_max = self.rng.gen_range(1..=4u32);
        let visibility_ms = self.rng.gen_range(50..=400u64);
        let cmd = match &mut self.state_clients[c].role {
            Role::Ledger {
                reader,
                writer,
                seen_lac,
            } => {
                if let Some(w) = writer {
                    let (ledger, writer_token) = (w.ledger, w.token);
                    if w.adds_left == 0 {
                        Command::CloseLedger {
                            ledger,
                            writer_token,
                        }
                    } else if let (true, Some(lac)) = (roll < 0.15, w.last_added) {
                        Command::SetLac {
                            ledger,
                            writer_token,
                            lac,
                        }
                    } else {
                        w.written += 1;
                        Command::AddEntry {
                            ledger,
                            writer_token,
                            data: format!("g{g}l{ledger}c{id}#{}", w.written).into_bytes(),
                        }
                    }
                } else if let (Some(ledger), true) = (pick, *reader) {
                    let lac = seen_lac.get(&ledger).copied().unwrap_or(0);
                    if roll < 0.1 {
                        Command::OpenRecover { ledger }
                    } else if roll < 0.55 {
                        return StateRequest::ReadLac { ledger };
                    } else {
                        let from = lac.saturating_sub(span);
                        return StateRequest::ReadEntries {
                            ledger,
                            from,
                            to: from + span,
                        };
                    }
                } else if *reader {
                    // Nothing to read yet: ask for a ledger no one creates
                    // (ids count up from 0), answered "no such ledger".
                    return StateRequest::ReadLac { ledger: u64::MAX };
                } else {
                    Command::CreateLedger {
                        writer_token: token,
                        now_ms: 0, // the leader stamps its clock
                    }
                }
            }
            Role::Producer { ready: false, .. } | Role::Consumer { ready: false, .. } => {
                Command::CreateQueue {
                    name: queue_name(g),
                    max_deliveries: QUEUE_MAX_DELIVERIES,
                }
            }
            Role::Producer {
                producer_id,
                seq,
                batch,
                ..
            } => {
                let messages = batch
                    .get_or_insert_with(|| {
                        (0..batch_len)
                            .map(|k| format!("g{g}p{producer_id}s{seq}m{k}").into_bytes())
                            .collect()
                    })
                    .clone();
                Command::Produce {
                    queue: queue_name(g),
                    producer_id: *producer_id,
                    seq: *seq,
                    messages,
                }
            }
            Role::Consumer { to_ack, .. } => {
                if to_ack.is_empty() {
                    Command::Consume {
                        queue: queue_name(g),
                        consumer: id as u64,
                        max: consume_max,
                        visibility_ms,
                        now_ms: 0, // the leader stamps its clock
                    }
                } else {
                    Command::Ack {
                        queue: queue_name(g),
                        ids: to_ack.clone(),
                    }
                }
            }
        };
        StateRequest::Command(cmd)
    }

    /// Updates the client's own view from an answer.
    fn client_learned(&mut self, c: usize, request: &StateRequest, result: &StateResult) {
        let g = self.state_clients[c].group;
        let mut created = None;
        let acks: Vec<bool> = match result {
            StateResult::Applied(Ok(Outcome::Consumed(d))) => {
                d.iter().map(|_| self.rng.gen_bool(0.75)).collect()
            }
            _ => Vec::new(),
        };
        let adds_max = self.rng.gen_range(3..=25);
        match (&mut self.state_clients[c].role, request) {
            (Role::Ledger { writer, .. }, StateRequest::Command(cmd)) => match (cmd, result) {
                (
                    Command::CreateLedger { writer_token, .. },
                    StateResult::Applied(Ok(Outcome::LedgerCreated(l))),
                ) => {
                    *writer = Some(Writer {
                        ledger: *l,
                        token: *writer_token,
                        adds_left: adds_max,
                        last_added: None,
                        written: 0,
                    });
                    created = Some(*l);
                }
                (Command::AddEntry { .. }, StateResult::Applied(Ok(Outcome::EntryAdded(e)))) => {
                    if let Some(w) = writer {
                        w.last_added = Some(*e);
                        w.adds_left = w.adds_left.saturating_sub(1);
                    }
                }
                // An add or LAC update it cannot confirm fails its ledger,
                // as a BookKeeper writer's handle fails: it writes a new
                // one. (Unknown adds piling up on one ledger also make its
                // linearizability search exponential.)
                (
                    Command::AddEntry { .. } | Command::SetLac { .. },
                    StateResult::Applied(Err(_)) | StateResult::Unknown,
                )
                | (Command::CloseLedger { .. }, _) => *writer = None,
                _ => {}
            },
            (Role::Ledger { seen_lac, .. }, StateRequest::ReadLac { ledger }) => {
                if let StateResult::Lac(Ok(Some(lac))) = result {
                    let seen = seen_lac.entry(*ledger).or_insert(0);
                    *seen = (*seen).max(*lac);
                }
            }
            (
                Role::Producer {
                    ready, seq, batch, ..
                },
                StateRequest::Command(cmd),
            ) => {
                match (cmd, result) {
                    (Command::CreateQueue { .. }, StateResult::Applied(_)) => *ready = true,
                    (Command::Produce { .. }, StateResult::Applied(_)) => {
                        // Known either way: the next batch gets the next seq.
                        *seq += 1;
                        *batch = None;
                    }
                    // Unknown: retry the same batch with the same seq.
                    _ => {}
                }
            }
            (Role::Consumer { ready, to_ack }, StateRequest::Command(cmd)) => match (cmd, result) {
                (Command::CreateQueue { .. }, StateResult::Applied(_)) => *ready = true,
                (Command::Consume { .. }, StateResult::Applied(Ok(Outcome::Consumed(d)))) => {
                    // Some messages are left to time out and come back.
                    to_ack.extend(d.iter().zip(&acks).filter(|(_, &a)| a).map(|(m, _)| m.id));
                }
                (Command::Ack { .. }, StateResult::Applied(_)) => to_ack.clear(),
                _ => {}
            },
            _ => {}
        }
        if let Some(l) = created {
            self.ledger_directory[g].push(l);
        }
    }

    /// A crash closes the connections to the replica: clients waiting on
    /// it will never hear back.
    pub(crate) fn abandon_state_clients_on(&mut self, n: usize, g: usize) {
        for c in 0..self.state_clients.len() {
            if self.state_clients[c].group != g {
                continue;
            }
            self.state_clients[c].conns.remove(&n);
            let hit = self.state_clients[c]
                .pending
                .as_ref()
                .and_then(|p| p.in_flight)
                .is_some_and(|(node, _, _)| node == n);
            if hit {
                self.state_call_lost(c, n);
            }
        }
    }
}

impl World {
    /// The history checkers of the workload, once the run has recovered.
    /// Operations still in flight go into the history as unknown first:
    /// they may have taken effect.
    pub(crate) fn final_checks(&mut self) -> Result<(), Violation> {
        for c in 0..self.state_clients.len() {
            if let Some(p) = self.state_clients[c].pending.take() {
                // A burst's commands each, in the order they were sent.
                let parts: Vec<(StateRequest, StateResult)> = if p.burst.is_empty() {
                    vec![(p.request, StateResult::Unknown)]
                } else {
                    p.burst
                        .into_iter()
                        .map(|b| (b.request, b.result.unwrap_or(StateResult::Unknown)))
                        .collect()
                };
                for (request, result) in parts {
                    self.state_history.push(StateOp {
                        client: c,
                        group: self.state_clients[c].group,
                        request,
                        invoked_ms: p.invoked_ms,
                        completed_ms: self.now,
                        result,
                    });
                }
            }
        }
        self.final_checks_hosted()
    }
}

impl World {
    /// `final_checks` on the production replicas: each reads back every
    /// entry its state refers to, then the workload's history checkers.
    fn final_checks_hosted(&mut self) -> Result<(), Violation> {
        // Every entry some replica's state refers to, as the first replica
        // that read it back holds it: every other must hold the same bytes
        // (a copy repaired from a peer included).
        let mut first_read: Vec<BTreeMap<u64, (usize, bytes::Bytes)>> =
            vec![BTreeMap::new(); self.opts.groups];
        for (n, node) in self.nodes.iter_mut().enumerate() {
            for (g, h) in node.hosted.iter_mut().enumerate() {
                let Some(h) = h.as_mut() else {
                    continue;
                };
                let r = &mut h.replica;
                let mut read = crate::node::replica::payload_at(&r.raft, &mut r.wal);
                let mut missing = None;
                let mut differs = None;
                r.machine.each_stored(&mut |i| match read(i) {
                    crate::state::Lookup::Payload(p) => match first_read[g].get(&i) {
                        Some((m, q)) if *q != p && differs.is_none() => differs = Some((i, *m)),
                        Some(_) => {}
                        None => {
                            first_read[g].insert(i, (n, p));
                        }
                    },
                    _ => {
                        missing.get_or_insert(i);
                    }
                });
                drop(read);
                if let Some(i) = missing {
                    return Err(stored_missing(n, g, i));
                }
                if let Some((i, m)) = differs {
                    return Err(Violation {
                        invariant: "stored-bytes-agree",
                        detail: format!(
                            "group {g}: node {} and node {} hold different bytes for log entry {i}, which their states refer to",
                            m + 1,
                            n + 1
                        ),
                    });
                }
            }
        }
        match self.opts.workload {
            Workload::Log => Ok(()),
            Workload::Ledger => super::ledger_check::check_ledger_history(&self.state_history),
            Workload::Queue => {
                for g in 0..self.opts.groups {
                    // The most advanced replica; all agree at equal index.
                    let most = self
                        .nodes
                        .iter_mut()
                        .filter_map(|n| n.hosted[g].as_mut())
                        .max_by_key(|h| h.replica.applied);
                    let Some(h) = most else {
                        continue;
                    };
                    let r = &mut h.replica;
                    super::queue_check::check_queue_history(
                        g,
                        &self.state_history,
                        &r.machine,
                        &queue_name(g),
                        &mut crate::node::replica::payload_at(&r.raft, &mut r.wal),
                    )?;
                }
                Ok(())
            }
        }
    }
}

fn stored_missing(n: usize, g: usize, index: u64) -> Violation {
    Violation {
        invariant: "stored-bytes-readable",
        detail: format!(
            "node {} group {g}: the state refers to log entry {index}, which the replica does not hold",
            n + 1
        ),
    }
}
