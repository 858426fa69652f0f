//! The state-machine workloads: simulated ledger and queue clients that
//! send [`Command`]s to the production replica (`Replica::propose_command`,
//! through the log) and reads to it (`Replica::query`, at the leader's
//! read index), and record every invocation and completion, with its
//! simulated time, for the history checkers of `ledger_check` and
//! `queue_check`.
//!
//! The planted workload bugs ([`WorkloadBug`]) live in the replica
//! (`node::replica::planted`), set only by the simulator.

use super::checker::Violation;
use super::world::{idx, Event, World};
use crate::node::ProposeError;
use crate::state::{Answer, Command, Error, Outcome, Query};

pub use crate::node::replica::tap::WorkloadBug;
use rand::Rng;
use std::collections::HashMap;

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
            | WorkloadBug::SnapshotWithoutMachine => Workload::Ledger,
            WorkloadBug::AckNotReplicated
            | WorkloadBug::ProduceNoDedup
            | WorkloadBug::DedupIgnoresProducer
            | WorkloadBug::SnapshotWithoutEntries => Workload::Queue,
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

/// What a state-machine client was answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateResult {
    /// The command was applied with this result.
    Applied(Result<Outcome, Error>),
    /// The LAC read.
    Lac(Result<Option<u64>, Error>),
    /// The entries read, as (id, data).
    Entries(Result<Vec<(u64, Vec<u8>)>, Error>),
    /// Definitely not applied (another entry took its index).
    NotApplied,
    /// The client cannot tell: it timed out or its node crashed. A
    /// command may or may not have taken effect.
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

/// An operation waiting for its answer.
#[derive(Clone, Debug)]
struct StatePending {
    node: usize,
    /// The operation id the replica's reply names.
    op: u64,
    request: StateRequest,
    invoked_ms: u64,
}

/// A production replica's reply to a state client.
pub(crate) struct StateAnswer {
    client: usize,
    op: u64,
    reply: HostedReply,
}

/// What a production replica answered: a command's outcome, or a query's.
enum HostedReply {
    Command(Result<Outcome, ProposeError>),
    Query(Result<Answer, ProposeError>),
}

/// The replies of the production replicas to state clients, drained by
/// the world after each drive.
pub(crate) type StateAnswers = std::sync::Arc<std::sync::Mutex<Vec<StateAnswer>>>;

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
#[derive(Clone, Debug)]
pub(crate) struct StateClient {
    id: usize,
    group: usize,
    guess: usize,
    generation: u64,
    pending: Option<StatePending>,
    role: Role,
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
        }
    }
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

    fn state_complete(&mut self, c: usize, p: StatePending, result: StateResult) {
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
        if let Some(p) = self.state_clients[c].pending.take() {
            self.state_complete(c, p, StateResult::Unknown);
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
        self.state_request_hosted(c, n, request)
    }

    /// Sends a state client's request to group `g`'s production replica on
    /// node `n`; its reply comes through `state_answers`.
    fn state_request_hosted(
        &mut self,
        c: usize,
        n: usize,
        request: StateRequest,
    ) -> Result<(), Violation> {
        let g = self.state_clients[c].group;
        self.next_op += 1;
        let op = self.next_op;
        let answers = self.state_answers.clone();
        let answer = move |reply| {
            let a = StateAnswer {
                client: c,
                op,
                reply,
            };
            answers.lock().expect("state answers").push(a);
        };
        let now = self.now;
        self.state_clients[c].pending = Some(StatePending {
            node: n,
            op,
            request: request.clone(),
            invoked_ms: now,
        });
        self.state_client_later(c, STATE_CLIENT_TIMEOUT_MS);
        let replica = &mut self.nodes[n].hosted[g]
            .as_mut()
            .expect("checked live")
            .replica;
        match request {
            StateRequest::Command(cmd) => replica.propose_command(
                0,
                0,
                cmd,
                now,
                Box::new(move |r| answer(HostedReply::Command(r))),
            ),
            StateRequest::ReadLac { ledger } => replica.query(
                Query::Ledger { ledger },
                0,
                Box::new(move |r| answer(HostedReply::Query(r))),
            ),
            StateRequest::ReadEntries { ledger, from, to } => replica.query(
                Query::ReadLedger { ledger, from, to },
                0,
                Box::new(move |r| answer(HostedReply::Query(r))),
            ),
        }
        self.drive(n, g)
    }

    /// Hands a production replica's reply to its state client, unless it
    /// gave up on it already.
    pub(crate) fn state_client_answered(&mut self, a: StateAnswer) -> Result<(), Violation> {
        let c = a.client;
        let ours = matches!(
            self.state_clients[c].pending,
            Some(StatePending { op, .. }) if op == a.op
        );
        if !ours {
            return Ok(());
        }
        let p = self.state_clients[c].pending.take().expect("checked");
        let g = self.state_clients[c].group;
        let failed = match a.reply {
            HostedReply::Command(Ok(o)) => Ok(StateResult::Applied(Ok(o))),
            HostedReply::Command(Err(ProposeError::Refused(e))) => Ok(StateResult::Applied(Err(e))),
            HostedReply::Command(Err(ProposeError::Lost)) => Ok(StateResult::NotApplied),
            HostedReply::Query(Ok(Answer::Ledger(info))) => Ok(StateResult::Lac(Ok(info.lac))),
            HostedReply::Query(Ok(Answer::Entries(es))) => Ok(StateResult::Entries(Ok(es
                .into_iter()
                .map(|e| (e.id, e.data))
                .collect()))),
            HostedReply::Query(Err(ProposeError::Refused(e))) => Ok(match p.request {
                StateRequest::ReadLac { .. } => StateResult::Lac(Err(e)),
                _ => StateResult::Entries(Err(e)),
            }),
            HostedReply::Query(Ok(other)) => {
                unreachable!("a ledger query answers a ledger or entries, not {other:?}")
            }
            HostedReply::Command(Err(e)) | HostedReply::Query(Err(e)) => Err(e),
        };
        let result = match failed {
            Ok(result) => result,
            Err(ProposeError::Unreadable(why)) => {
                return Err(Violation {
                    invariant: "stored-bytes-readable",
                    detail: format!("node {} group {g}: {why}", p.node + 1),
                })
            }
            // Refused before it was proposed (or, for a read, before it
            // was answered): nothing to record.
            Err(ProposeError::NotLeader(leader)) => {
                self.state_clients[c].guess = match leader {
                    Some(l) => idx(l),
                    None => self.rng.gen_range(0..self.nodes.len()),
                };
                let backoff = self.rng.gen_range(2..=15);
                self.state_client_later(c, backoff);
                return Ok(());
            }
            Err(
                ProposeError::DiskFull
                | ProposeError::TooLarge { .. }
                | ProposeError::Busy(_)
                | ProposeError::Invalid(_),
            ) => {
                let backoff = self.rng.gen_range(5..=30);
                self.state_client_later(c, backoff);
                return Ok(());
            }
            // The group stopped with it in flight, or worse: it may have
            // taken effect.
            Err(_) => StateResult::Unknown,
        };
        self.state_complete(c, p, result);
        Ok(())
    }

    /// The client's next request, from its role and what it knows.
    fn next_request(&mut self, c: usize) -> StateRequest {
        let (g, id) = (self.state_clients[c].group, self.state_clients[c].id);
        let now = self.now;
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
                        now_ms: now,
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
                        now_ms: now,
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
                (Command::AddEntry { .. }, StateResult::Unknown | StateResult::NotApplied) => {
                    if let Some(w) = writer {
                        w.adds_left = w.adds_left.saturating_sub(1);
                    }
                }
                (
                    Command::AddEntry { .. } | Command::SetLac { .. },
                    StateResult::Applied(Err(_)),
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

    /// Clients waiting on a replica that crashed will never hear back.
    pub(crate) fn abandon_state_clients_on(&mut self, n: usize, g: usize) {
        for c in 0..self.state_clients.len() {
            let hit = self.state_clients[c]
                .pending
                .as_ref()
                .is_some_and(|p| p.node == n && self.state_clients[c].group == g);
            if hit {
                let p = self.state_clients[c].pending.take().expect("checked");
                self.state_complete(c, p, StateResult::Unknown);
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
                self.state_history.push(StateOp {
                    client: c,
                    group: self.state_clients[c].group,
                    request: p.request,
                    invoked_ms: p.invoked_ms,
                    completed_ms: self.now,
                    result: StateResult::Unknown,
                });
            }
        }
        self.final_checks_hosted()
    }
}

impl World {
    /// `final_checks` on the production replicas: each reads back every
    /// entry its state refers to, then the workload's history checkers.
    fn final_checks_hosted(&mut self) -> Result<(), Violation> {
        for (n, node) in self.nodes.iter_mut().enumerate() {
            for (g, h) in node.hosted.iter_mut().enumerate() {
                let Some(h) = h.as_mut() else {
                    continue;
                };
                let r = &mut h.replica;
                let mut read = crate::node::replica::payload_at(&r.raft, &mut r.wal);
                let mut missing = None;
                r.machine.each_stored(&mut |i| {
                    if missing.is_none() && read(i).is_none() {
                        missing = Some(i);
                    }
                });
                drop(read);
                if let Some(i) = missing {
                    return Err(stored_missing(n, g, i));
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
