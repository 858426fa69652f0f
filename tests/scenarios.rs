//! Table-driven scenario tests for the consensus core, in the style of etcd
//! raft's datadriven test data.
//!
//! Every `tests/scenarios/*.txt` file is a list of steps and expectations.
//! This interpreter runs it against `N` [`Raft`] instances (ids `1..=N`)
//! with a manual clock and a manual message queue: nothing sleeps, and the
//! same file always runs the same way.
//!
//! # The driver (the `Ready` contract of `consensus/mod.rs`)
//!
//! After every input to a node the driver calls `ready()` on it (until it
//! comes back empty) and
//! - puts `messages` into the network queue at once;
//! - appends the write (`snapshot`, `truncate_from`, `entries`,
//!   `hard_state`) to the node's *pending writes*, which model its disk
//!   cache;
//! - holds `messages_after_persist` until the node is persisted;
//! - restores a received snapshot into the (recorded) state machine, applies
//!   `committed` and calls `applied(i)`; records `read_states`.
//!
//! *Persisting* a node applies its pending writes, in order, to its durable
//! store (a [`RestoredState`]: a snapshot replaces the whole log,
//! `truncate_from` drops the tail, entries are appended), releases its held
//! messages into the network and reports `persisted(index, term)` for each
//! write. `crash` drops the pending writes and held messages (unsynced data
//! is lost); `restart` rebuilds the node with [`Raft::restore`] from its
//! durable store.
//!
//! After every step the interpreter checks election safety (one leader per
//! term), log matching between any two nodes, state machine safety (no two
//! nodes apply different entries at one index), that the highest-term leader
//! holds every applied entry, and after `stabilize` that each node's durable
//! store equals its in-memory log and hard state.
//!
//! # Commands
//!
//! `#` starts a comment. `N` is a node id, `NODES` a list such as `1,2,3` or
//! `all` (every node that is up); `SEL` selects messages: `1->3`, `1->*`,
//! `*->3` or `*` (the default). Message types are the `Body` variant names
//! (`Append`, `Heartbeat`, `PreVote`, ...) or `votes` for the four vote
//! kinds. Unknown commands and keys are errors, so a typo cannot pass.
//!
//! Setup:
//! - `cluster n=3 [pre_vote=true] [check_quorum=true] [election=150]
//!   [heartbeat=30] [append_bytes=1048576] [snapshot_entries=100000]
//!   [snapshot_chunk=1048576] [inflight_msgs=64] [preferred=RANK]
//!   [hold=2000]` starts a fresh world (a file may hold several);
//!   `preferred` is the group's `preferred_leader_rank` (none by default)
//!   and `hold` its `preferred_leader_hold_ms`;
//! - `log N terms=1,1,4 [term=T] [vote=V] [commit=C]` replaces node N's
//!   durable state with that log (entry data is `index@term`) and restarts
//!   it from it; `term` defaults to the last entry's term.
//!
//! Inputs:
//! - `campaign N`, `tick NODES [ms=0]` (clock moves by `ms`, then only
//!   these nodes are ticked);
//! - `advance ms=X [nodes=NODES]`: the clock moves to each deadline
//!   (`poll_timeout`) up to now+X and ticks the due nodes; nothing is
//!   delivered or persisted;
//! - `run ms=X`: like `advance`, but the world is stabilized after every
//!   tick, so messages take no time;
//! - `propose N DATA [count=1] [index=I]`, `transfer N to=T`,
//!   `add-learner N id=I [index=I]`, `add-voter N id=I [index=I]`,
//!   `remove N id=I [index=I]`, `compact N [index=I]`, `read-index N id=R`;
//!   `index=` checks where the entry landed, and each takes
//!   `error=Variant [leader=L]` to expect a refusal instead. Adding a node
//!   that does not exist starts it (empty log, no initial voters).
//!
//! Network and disks:
//! - `stabilize [nodes=NODES] [types=T,..]`: persist and deliver until
//!   nothing moves; messages outside the selection stay queued;
//! - `deliver [SEL] [type=T] [count=K]`, `drop [SEL] [type=T] [count=K]`;
//! - `persist NODES`, `isolate NODES`, `cut A B` (both ways between two
//!   nodes), `lose [SEL] type=T` (every such message is lost from now on),
//!   `heal` (ends isolations, cuts and losses), `crash NODES`,
//!   `restart NODES`.
//!
//! Failure-detector inputs (what the serial heartbeat would report):
//! `peer-down NODES peer=P`, `leader-seen NODES leader=L term=T`,
//! `observe-term NODES term=T`, `step-down NODES` (own disk stalled).
//!
//! Expectations (`expect WHAT NODES VALUE`, one failure line per node):
//! `role` (leader, follower, candidate, pre-candidate), `term`, `vote`,
//! `leader` (id or none), `commit`, `applied`, `voters`, `learners` (list or
//! none), `snapshot-wanted` (true/false), `log terms=.. [first=1]`,
//! `durable terms=.. [first=1] [term=] [vote=] [commit=]`,
//! `snapshot index=I|none [term=T]`, `transfer` (target or none),
//! `stat NAME=VALUE` (a `RaftStats` field), `read N id=R index=I|none`,
//! `queued SEL [type=T] count=K`.
//!
//! Set `QUIRE_SCENARIO_TRACE=1` to print every step and message.

use quire::consensus::{
    AppendResult, Body, Entry, HardState, Index, MembershipChange, Message, NodeId, Payload, Raft,
    RaftConfig, RaftError, ReadState, RestoredState, Role, Snapshot, Term,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                run_file(stringify!($name));
            }
        )*
        const SCENARIOS: &[&str] = &[$(stringify!($name)),*];
    };
}

scenarios!(
    figure7,
    figure8,
    vote_rules,
    prevote,
    check_quorum,
    failover,
    transfer,
    preferred_leader,
    membership,
    snapshot,
    snapshot_chunks,
    snapshot_replaced,
    read_index,
    may_lead,
);

/// A file nobody runs is a test nobody notices failing.
#[test]
fn every_scenario_file_has_a_test() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .expect("tests/scenarios exists")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".txt").map(str::to_owned)
        })
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = SCENARIOS.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(
        on_disk, listed,
        "list every tests/scenarios/*.txt in scenarios!()"
    );
}

/// Runs one scenario file; panics with file, line, step and state on the
/// first failing step.
fn run_file(name: &str) {
    let rel = format!("tests/scenarios/{name}.txt");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(&rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let trace = std::env::var_os("QUIRE_SCENARIO_TRACE").is_some_and(|v| v != "0");
    let mut world: Option<World> = None;
    for (i, raw) in text.lines().enumerate() {
        let step = raw.split('#').next().unwrap_or("").trim();
        if step.is_empty() {
            continue;
        }
        if trace {
            eprintln!("{rel}:{}: {step}", i + 1);
        }
        if let Err(why) = exec(&mut world, step, trace) {
            let state = world
                .as_ref()
                .map_or_else(|| "(no cluster yet)".to_string(), World::dump);
            panic!(
                "\n{rel}:{}: step `{step}` failed:\n  {why}\n\nstate after the step:\n{state}",
                i + 1
            );
        }
    }
}

fn exec(world: &mut Option<World>, step: &str, trace: bool) -> Result<(), String> {
    let mut a = Args::parse(step)?;
    if a.cmd == "cluster" {
        let w = World::new(&mut a, trace)?;
        a.done()?;
        *world = Some(w);
        return Ok(());
    }
    let w = world.as_mut().ok_or("the first step must be `cluster`")?;
    w.exec(&mut a)?;
    a.done()?;
    w.check_invariants()
}

// ----- arguments ---------------------------------------------------------

/// One step: a command, positional words and `key=value` pairs. Every
/// argument must be consumed, so a misspelt key fails instead of being
/// ignored.
struct Args {
    cmd: String,
    pos: VecDeque<String>,
    keys: BTreeMap<String, String>,
}

impl Args {
    fn parse(step: &str) -> Result<Args, String> {
        let mut words = step.split_whitespace();
        let cmd = words.next().ok_or("empty step")?.to_string();
        let mut pos = VecDeque::new();
        let mut keys = BTreeMap::new();
        for w in words {
            match w.split_once('=') {
                Some((k, v)) => {
                    if keys.insert(k.to_string(), v.to_string()).is_some() {
                        return Err(format!("key `{k}` given twice"));
                    }
                }
                None => pos.push_back(w.to_string()),
            }
        }
        Ok(Args { cmd, pos, keys })
    }

    fn pos(&mut self, what: &str) -> Result<String, String> {
        self.pos
            .pop_front()
            .ok_or_else(|| format!("`{}` needs {what}", self.cmd))
    }

    fn opt_pos(&mut self) -> Option<String> {
        self.pos.pop_front()
    }

    fn key(&mut self, k: &str) -> Option<String> {
        self.keys.remove(k)
    }

    fn req(&mut self, k: &str) -> Result<String, String> {
        self.key(k)
            .ok_or_else(|| format!("`{}` needs {k}=", self.cmd))
    }

    fn u64_or(&mut self, k: &str, default: u64) -> Result<u64, String> {
        self.key(k).map_or(Ok(default), |v| num(&v))
    }

    fn bool_or(&mut self, k: &str, default: bool) -> Result<bool, String> {
        self.key(k).map_or(Ok(default), |v| boolean(&v))
    }

    fn done(&self) -> Result<(), String> {
        if let Some(p) = self.pos.front() {
            return Err(format!("unexpected argument `{p}`"));
        }
        if let Some(k) = self.keys.keys().next() {
            return Err(format!("unknown key `{k}=` for `{}`", self.cmd));
        }
        Ok(())
    }
}

fn num(s: &str) -> Result<u64, String> {
    s.parse().map_err(|_| format!("`{s}` is not a number"))
}

fn boolean(s: &str) -> Result<bool, String> {
    match s {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("`{s}` is not true or false")),
    }
}

/// `none` or a number.
fn opt_num(s: &str) -> Result<Option<u64>, String> {
    if s == "none" {
        Ok(None)
    } else {
        num(s).map(Some)
    }
}

/// `1,2,3`, or `-`/`none` for an empty list.
fn num_list(s: &str) -> Result<Vec<u64>, String> {
    if s == "-" || s == "none" || s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',').map(num).collect()
}

fn fmt_list(v: impl IntoIterator<Item = u64>) -> String {
    let s: Vec<String> = v.into_iter().map(|x| x.to_string()).collect();
    if s.is_empty() {
        "-".into()
    } else {
        s.join(",")
    }
}

fn fmt_opt(v: Option<u64>) -> String {
    v.map_or_else(|| "none".into(), |x| x.to_string())
}

const MSG_TYPES: &[&str] = &[
    "PreVote",
    "PreVoteResponse",
    "Vote",
    "VoteResponse",
    "Append",
    "AppendResponse",
    "Heartbeat",
    "HeartbeatResponse",
    "InstallSnapshot",
    "SnapshotAck",
    "TimeoutNow",
];

fn msg_type(b: &Body) -> &'static str {
    match b {
        Body::PreVote { .. } => "PreVote",
        Body::PreVoteResponse { .. } => "PreVoteResponse",
        Body::Vote { .. } => "Vote",
        Body::VoteResponse { .. } => "VoteResponse",
        Body::Append { .. } => "Append",
        Body::AppendResponse(_) => "AppendResponse",
        Body::Heartbeat { .. } => "Heartbeat",
        Body::HeartbeatResponse { .. } => "HeartbeatResponse",
        Body::InstallSnapshot { .. } => "InstallSnapshot",
        Body::SnapshotAck { .. } => "SnapshotAck",
        Body::TimeoutNow => "TimeoutNow",
        Body::RepairRequest { .. } => "RepairRequest",
        Body::RepairEntries { .. } => "RepairEntries",
    }
}

/// `T,T,..` of message types; `votes` stands for the four vote kinds.
fn type_set(s: &str) -> Result<BTreeSet<&'static str>, String> {
    let mut out = BTreeSet::new();
    for t in s.split(',') {
        if t == "votes" {
            out.extend(["PreVote", "PreVoteResponse", "Vote", "VoteResponse"]);
            continue;
        }
        let known = MSG_TYPES
            .iter()
            .find(|&&k| k == t)
            .ok_or_else(|| format!("unknown message type `{t}` (one of {MSG_TYPES:?} or votes)"))?;
        out.insert(*known);
    }
    Ok(out)
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Follower => "follower",
        Role::PreCandidate => "pre-candidate",
        Role::Candidate => "candidate",
        Role::Leader => "leader",
    }
}

fn error_name(e: &RaftError) -> &'static str {
    match e {
        RaftError::NotLeader { .. } => "NotLeader",
        RaftError::TransferInProgress => "TransferInProgress",
        RaftError::MembershipChangePending => "MembershipChangePending",
        RaftError::InvalidMembershipChange(_) => "InvalidMembershipChange",
        RaftError::InvalidIndex(_) => "InvalidIndex",
    }
}

/// The outcome a step expects: success, or `error=Variant` (and, for
/// `NotLeader`, `leader=`).
struct Outcome {
    error: Option<String>,
    leader: Option<Option<NodeId>>,
}

impl Outcome {
    fn parse(a: &mut Args) -> Result<Outcome, String> {
        Ok(Outcome {
            error: a.key("error"),
            leader: a.key("leader").map(|s| opt_num(&s)).transpose()?,
        })
    }

    /// The value on an expected success; `None` on an expected refusal.
    fn check<T: std::fmt::Debug>(&self, got: Result<T, RaftError>) -> Result<Option<T>, String> {
        match (got, &self.error) {
            (Ok(v), None) => Ok(Some(v)),
            (Ok(v), Some(e)) => Err(format!("expected error {e}, got Ok({v:?})")),
            (Err(e), None) => Err(format!("unexpected error: {e:?}")),
            (Err(e), Some(want)) => {
                if error_name(&e) != want {
                    return Err(format!("expected error {want}, got {e:?}"));
                }
                if let (Some(want_l), RaftError::NotLeader { leader }) = (self.leader, &e) {
                    if *leader != want_l {
                        return Err(format!(
                            "expected NotLeader with leader {}, got {e:?}",
                            fmt_opt(want_l)
                        ));
                    }
                }
                Ok(None)
            }
        }
    }
}

/// Which messages a `deliver`, `drop`, `lose` or `expect queued` applies to.
struct Selector {
    from: Option<BTreeSet<NodeId>>,
    to: Option<BTreeSet<NodeId>>,
    types: Option<BTreeSet<&'static str>>,
}

impl Selector {
    fn parse(spec: Option<&str>, types: Option<&str>) -> Result<Selector, String> {
        let side = |s: &str| -> Result<Option<BTreeSet<NodeId>>, String> {
            if s == "*" {
                Ok(None)
            } else {
                Ok(Some(num_list(s)?.into_iter().collect()))
            }
        };
        let (from, to) = match spec {
            None | Some("*") => (None, None),
            Some(s) => {
                let (f, t) = s
                    .split_once("->")
                    .ok_or_else(|| format!("`{s}` is not FROM->TO"))?;
                (side(f)?, side(t)?)
            }
        };
        let types = types.map(type_set).transpose()?;
        Ok(Selector { from, to, types })
    }

    fn matches(&self, m: &Message) -> bool {
        self.from.as_ref().is_none_or(|f| f.contains(&m.from))
            && self.to.as_ref().is_none_or(|t| t.contains(&m.to))
            && self
                .types
                .as_ref()
                .is_none_or(|t| t.contains(msg_type(&m.body)))
    }
}

fn describe(m: &Message) -> String {
    let ents = |es: &[Entry]| {
        es.iter()
            .map(|e| format!("{}@{}", e.index, e.term))
            .collect::<Vec<_>>()
            .join(",")
    };
    let body = match &m.body {
        Body::PreVote {
            last_index,
            last_term,
        } => format!("last={last_index}@{last_term}"),
        Body::PreVoteResponse { granted } | Body::VoteResponse { granted } => {
            format!("granted={granted}")
        }
        Body::Vote {
            last_index,
            last_term,
            transfer,
        } => format!("last={last_index}@{last_term} transfer={transfer}"),
        Body::Append {
            prev_index,
            prev_term,
            entries,
            commit,
        } => format!(
            "prev={prev_index}@{prev_term} entries=[{}] commit={commit}",
            ents(entries)
        ),
        Body::AppendResponse(AppendResult::Accepted { match_index }) => {
            format!("accepted match={match_index}")
        }
        Body::AppendResponse(AppendResult::Rejected {
            rejected_index,
            hint_index,
            hint_term,
        }) => format!("rejected {rejected_index} hint={hint_index}@{hint_term}"),
        Body::Heartbeat { commit, read_round } => format!("commit={commit} round={read_round}"),
        Body::HeartbeatResponse { read_round } => format!("round={read_round}"),
        Body::InstallSnapshot {
            snapshot,
            offset,
            total,
        } => {
            let (i, t, n) = (snapshot.index, snapshot.term, snapshot.data.len());
            format!("snapshot={i}@{t} bytes={offset}+{n}/{total}")
        }
        Body::SnapshotAck { index, received } => format!("snapshot={index} received={received}"),
        Body::TimeoutNow => String::new(),
        Body::RepairRequest { indexes } => format!("indexes={indexes:?}"),
        Body::RepairEntries { entries, not_held } => {
            format!("entries=[{}] not_held={not_held:?}", ents(entries))
        }
    };
    format!(
        "{}->{} t{} {} {body}",
        m.from,
        m.to,
        m.term,
        msg_type(&m.body)
    )
}

// ----- the world -----------------------------------------------------------

/// Cluster-wide settings from the `cluster` step.
#[derive(Clone, Debug)]
struct Settings {
    pre_vote: bool,
    check_quorum: bool,
    election_ms: u64,
    heartbeat_ms: u64,
    append_bytes: usize,
    snapshot_entries: u64,
    snapshot_chunk: usize,
    inflight_msgs: usize,
    preferred: Option<u64>,
    hold_ms: u64,
}

/// What one `Ready` asked storage to write, in the order it is carried out.
#[derive(Debug)]
struct Write {
    snapshot: Option<Snapshot>,
    truncate_from: Option<Index>,
    entries: Vec<Entry>,
    hard_state: Option<HardState>,
}

/// One host: a replica, its disk (durable store plus unsynced writes) and
/// its recorded state machine.
struct Node {
    cfg: RaftConfig,
    /// `None` while crashed.
    raft: Option<Raft>,
    durable: RestoredState,
    pending: Vec<Write>,
    held: Vec<Message>,
    /// Highest index applied to the (recorded) state machine.
    applied: Index,
    read_states: Vec<ReadState>,
    snapshot_wanted: bool,
    restarts: u64,
}

impl Node {
    fn start(cfg: RaftConfig, now_ms: u64, durable: RestoredState, restarts: u64) -> Node {
        let seed = cfg.id * 1000 + restarts;
        let applied = durable.snapshot.as_ref().map_or(0, |s| s.index);
        Node {
            raft: Some(
                Raft::restore(cfg.clone(), seed, now_ms, durable.clone())
                    .unwrap_or_else(|e| panic!("the scenario's config: {e}")),
            ),
            cfg,
            durable,
            pending: Vec::new(),
            held: Vec::new(),
            applied,
            read_states: Vec::new(),
            snapshot_wanted: false,
            restarts,
        }
    }
}

fn durable_last(d: &RestoredState) -> Index {
    d.entries
        .last()
        .map(|e| e.index)
        .or(d.snapshot.as_ref().map(|s| s.index))
        .unwrap_or(0)
}

struct World {
    settings: Settings,
    nodes: BTreeMap<NodeId, Node>,
    net: VecDeque<Message>,
    isolated: BTreeSet<NodeId>,
    /// Two-way cuts between pairs of nodes, (lower id, higher id).
    cuts: BTreeSet<(NodeId, NodeId)>,
    /// Messages the network loses until `heal`.
    losses: Vec<Selector>,
    now_ms: u64,
    trace: bool,
    /// Election safety: the leader seen in each term.
    leaders: BTreeMap<Term, NodeId>,
    /// State machine safety: the entry applied at each index, by anyone.
    applied: BTreeMap<Index, Entry>,
}

impl World {
    fn new(a: &mut Args, trace: bool) -> Result<World, String> {
        let n = num(&a.req("n")?)?;
        if n == 0 {
            return Err("n must be at least 1".into());
        }
        let settings = Settings {
            pre_vote: a.bool_or("pre_vote", true)?,
            check_quorum: a.bool_or("check_quorum", true)?,
            election_ms: a.u64_or("election", 150)?,
            heartbeat_ms: a.u64_or("heartbeat", 30)?,
            append_bytes: a.u64_or("append_bytes", 1 << 20)? as usize,
            snapshot_entries: a.u64_or("snapshot_entries", 100_000)?,
            snapshot_chunk: a.u64_or("snapshot_chunk", 1 << 20)? as usize,
            inflight_msgs: a.u64_or("inflight_msgs", 64)? as usize,
            preferred: a.key("preferred").map_or(Ok(None), |v| opt_num(&v))?,
            hold_ms: a.u64_or("hold", 2000)?,
        };
        let mut w = World {
            settings,
            nodes: BTreeMap::new(),
            net: VecDeque::new(),
            isolated: BTreeSet::new(),
            cuts: BTreeSet::new(),
            losses: Vec::new(),
            now_ms: 0,
            trace,
            leaders: BTreeMap::new(),
            applied: BTreeMap::new(),
        };
        let voters: Vec<NodeId> = (1..=n).collect();
        for id in 1..=n {
            let cfg = w.config(id, voters.clone());
            w.nodes
                .insert(id, Node::start(cfg, 0, RestoredState::default(), 0));
        }
        Ok(w)
    }

    fn config(&self, id: NodeId, voters: Vec<NodeId>) -> RaftConfig {
        let s = &self.settings;
        let mut cfg = RaftConfig::new(id, voters);
        cfg.pre_vote = s.pre_vote;
        cfg.check_quorum = s.check_quorum;
        cfg.election_timeout_ms = s.election_ms;
        cfg.heartbeat_interval_ms = s.heartbeat_ms;
        cfg.append_bytes_max = s.append_bytes;
        cfg.snapshot_entries = s.snapshot_entries;
        cfg.snapshot_chunk_bytes = s.snapshot_chunk;
        cfg.inflight_msgs_max = s.inflight_msgs;
        cfg.preferred_leader_rank = s.preferred;
        cfg.preferred_leader_hold_ms = s.hold_ms;
        cfg
    }

    fn node(&self, id: NodeId) -> Result<&Node, String> {
        self.nodes.get(&id).ok_or_else(|| format!("no node {id}"))
    }

    fn node_mut(&mut self, id: NodeId) -> Result<&mut Node, String> {
        self.nodes
            .get_mut(&id)
            .ok_or_else(|| format!("no node {id}"))
    }

    fn raft(&self, id: NodeId) -> Result<&Raft, String> {
        self.node(id)?
            .raft
            .as_ref()
            .ok_or_else(|| format!("node {id} is down"))
    }

    fn raft_mut(&mut self, id: NodeId) -> Result<&mut Raft, String> {
        self.node_mut(id)?
            .raft
            .as_mut()
            .ok_or_else(|| format!("node {id} is down"))
    }

    fn live(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.raft.is_some())
            .map(|(&id, _)| id)
            .collect()
    }

    /// `all` (every running node) or a list of existing node ids.
    fn ids(&self, s: &str) -> Result<Vec<NodeId>, String> {
        if s == "all" {
            return Ok(self.live());
        }
        let ids = num_list(s)?;
        if ids.is_empty() {
            return Err("empty node list".into());
        }
        for id in &ids {
            self.node(*id)?;
        }
        Ok(ids)
    }

    fn one_id(&self, a: &mut Args) -> Result<NodeId, String> {
        let s = a.pos("a node id")?;
        let id = num(&s)?;
        self.node(id)?;
        Ok(id)
    }

    fn log_trace(&self, what: impl FnOnce() -> String) {
        if self.trace {
            eprintln!("    [{:>5} ms] {}", self.now_ms, what());
        }
    }

    /// True if a partition separates `a` from `b`.
    fn cut(&self, a: NodeId, b: NodeId) -> bool {
        self.isolated.contains(&a)
            || self.isolated.contains(&b)
            || self.cuts.contains(&(a.min(b), a.max(b)))
    }

    fn send(&mut self, m: Message) {
        if self.cut(m.from, m.to) {
            self.log_trace(|| format!("lost (partition) {}", describe(&m)));
            return;
        }
        self.log_trace(|| format!("send {}", describe(&m)));
        self.net.push_back(m);
    }

    // ----- the Ready loop ------------------------------------------------

    /// Drains `ready()` on node `id`. Returns true if anything came out.
    fn process_ready(&mut self, id: NodeId) -> Result<bool, String> {
        let mut moved = false;
        for _ in 0..1000 {
            let node = self.node_mut(id)?;
            let Some(raft) = node.raft.as_mut() else {
                return Ok(moved);
            };
            let rd = raft.ready();
            // Raised once; it stays wanted until the node compacts.
            node.snapshot_wanted |= rd.snapshot_wanted;
            let busy = rd.hard_state.is_some()
                || rd.snapshot.is_some()
                || rd.truncate_from.is_some()
                || !rd.entries.is_empty()
                || !rd.messages.is_empty()
                || !rd.messages_after_persist.is_empty()
                || !rd.committed.is_empty()
                || !rd.read_states.is_empty();
            if !busy {
                return Ok(moved);
            }
            moved = true;
            if rd.hard_state.is_some()
                || rd.snapshot.is_some()
                || rd.truncate_from.is_some()
                || !rd.entries.is_empty()
            {
                node.pending.push(Write {
                    snapshot: rd.snapshot.clone(),
                    truncate_from: rd.truncate_from,
                    entries: rd.entries,
                    hard_state: rd.hard_state,
                });
            }
            node.held.extend(rd.messages_after_persist);
            // A snapshot from the leader replaces the state machine before
            // anything else is applied.
            if let Some(s) = &rd.snapshot {
                node.applied = s.index;
            }
            for e in &rd.committed {
                if e.index != node.applied + 1 {
                    return Err(format!(
                        "node {id} was handed entry {} to apply after applying {}",
                        e.index, node.applied
                    ));
                }
                node.applied = e.index;
            }
            if let Some(last) = rd.committed.last() {
                raft.applied(last.index);
            }
            node.read_states.extend(rd.read_states);
            if let Some(s) = &rd.snapshot {
                self.log_trace(|| format!("node {id} restores snapshot {}@{}", s.index, s.term));
            }
            for e in rd.committed {
                self.log_trace(|| format!("node {id} applies {}@{}", e.index, e.term));
                match self.applied.get(&e.index) {
                    Some(other) if *other != e => {
                        return Err(format!(
                            "state machine safety violated: node {id} applied {e:?}, \
                             another node applied {other:?} at the same index"
                        ));
                    }
                    Some(_) => {}
                    None => {
                        self.applied.insert(e.index, e);
                    }
                }
            }
            for m in rd.messages {
                self.send(m);
            }
        }
        Err(format!("node {id}: ready() never ran dry"))
    }

    /// Makes node `id`'s pending writes durable and lets it act on that.
    /// Returns true if there was anything to do.
    fn persist(&mut self, id: NodeId) -> Result<bool, String> {
        let node = self.node_mut(id)?;
        if node.raft.is_none() || (node.pending.is_empty() && node.held.is_empty()) {
            return Ok(false);
        }
        let mut reports = Vec::new();
        for w in std::mem::take(&mut node.pending) {
            let d = &mut node.durable;
            if let Some(s) = w.snapshot {
                // A snapshot from the leader replaces the whole log.
                reports.push((s.index, s.term));
                d.entries.clear();
                d.snapshot = Some(s);
            }
            if let Some(from) = w.truncate_from {
                d.entries.retain(|e| e.index < from);
            }
            if let Some(last) = w.entries.last() {
                reports.push((last.index, last.term));
            }
            for e in w.entries {
                let want = durable_last(d) + 1;
                if e.index != want {
                    return Err(format!(
                        "node {id}: Ready asked to write entry {} where the durable log \
                         continues at {want}",
                        e.index
                    ));
                }
                d.entries.push(e);
            }
            if let Some(hs) = w.hard_state {
                d.hard_state = hs;
            }
        }
        let held = std::mem::take(&mut node.held);
        for m in held {
            self.send(m);
        }
        self.log_trace(|| format!("node {id} persisted {reports:?}"));
        let raft = self.raft_mut(id)?;
        for (index, term) in reports {
            raft.persisted(index, term);
        }
        self.process_ready(id)?;
        Ok(true)
    }

    fn deliver(&mut self, m: Message) -> Result<(), String> {
        if self.cut(m.from, m.to) {
            self.log_trace(|| format!("lost (partition) {}", describe(&m)));
            return Ok(());
        }
        if self.losses.iter().any(|sel| sel.matches(&m)) {
            self.log_trace(|| format!("lost (by `lose`) {}", describe(&m)));
            return Ok(());
        }
        let now = self.now_ms;
        let Some(raft) = self.nodes.get_mut(&m.to).and_then(|n| n.raft.as_mut()) else {
            self.log_trace(|| format!("lost (node down) {}", describe(&m)));
            return Ok(());
        };
        let to = m.to;
        if self.trace {
            eprintln!("    [{now:>5} ms] deliver {}", describe(&m));
        }
        raft.step(now, m);
        self.process_ready(to)?;
        Ok(())
    }

    /// Removes the queued messages matching `sel` (at most `count`).
    fn take_messages(&mut self, sel: &Selector, count: Option<usize>) -> Vec<Message> {
        let mut taken = Vec::new();
        let mut kept = VecDeque::new();
        for m in std::mem::take(&mut self.net) {
            if sel.matches(&m) && count.is_none_or(|c| taken.len() < c) {
                taken.push(m);
            } else {
                kept.push_back(m);
            }
        }
        self.net = kept;
        taken
    }

    /// Persists and delivers among `nodes` (messages of `types`) until
    /// nothing moves.
    fn stabilize(
        &mut self,
        nodes: Option<&BTreeSet<NodeId>>,
        types: Option<&BTreeSet<&'static str>>,
    ) -> Result<(), String> {
        let sel = Selector {
            from: nodes.cloned(),
            to: nodes.cloned(),
            types: types.cloned(),
        };
        for _ in 0..10_000 {
            let mut moved = false;
            let ids: Vec<NodeId> = match nodes {
                Some(n) => n.iter().copied().collect(),
                None => self.live(),
            };
            for &id in &ids {
                moved |= self.process_ready(id)?;
            }
            for &id in &ids {
                moved |= self.persist(id)?;
            }
            let msgs = self.take_messages(&sel, None);
            moved |= !msgs.is_empty();
            for m in msgs {
                self.deliver(m)?;
            }
            self.check_invariants()?;
            if !moved {
                return self.check_durable(&ids);
            }
        }
        Err("stabilize: the cluster never went quiet".into())
    }

    /// Moves the clock by `ms`, ticking the nodes (of `only`, else all live)
    /// at each of their deadlines; with `settle`, stabilizes after each tick.
    fn run_clock(
        &mut self,
        ms: u64,
        only: Option<Vec<NodeId>>,
        settle: bool,
    ) -> Result<(), String> {
        let target = self.now_ms + ms;
        for _ in 0..100_000 {
            let ids: Vec<NodeId> = only.clone().unwrap_or_else(|| self.live());
            let next = ids
                .iter()
                .filter_map(|&id| self.raft(id).ok().map(Raft::poll_timeout))
                .min();
            let Some(next) = next.filter(|&t| t <= target) else {
                // Bring every clock to the target, so that inputs after this
                // step see the time the scenario says it is.
                self.now_ms = target;
                for id in ids {
                    if let Ok(raft) = self.raft_mut(id) {
                        raft.tick(target);
                        self.process_ready(id)?;
                    }
                }
                if settle {
                    self.stabilize(None, None)?;
                }
                return Ok(());
            };
            self.now_ms = self.now_ms.max(next);
            let now = self.now_ms;
            for id in ids {
                let Ok(raft) = self.raft_mut(id) else {
                    continue;
                };
                let deadline = raft.poll_timeout();
                if deadline <= now {
                    raft.tick(now);
                    if raft.poll_timeout() <= now {
                        return Err(format!(
                            "node {id}: tick at {now} left its deadline in the past"
                        ));
                    }
                    self.log_trace(|| format!("tick node {id} (deadline {deadline})"));
                    self.process_ready(id)?;
                }
            }
            if settle {
                self.stabilize(None, None)?;
            }
            self.check_invariants()?;
        }
        Err("the clock got stuck".into())
    }

    // ----- commands --------------------------------------------------------

    fn exec(&mut self, a: &mut Args) -> Result<(), String> {
        match a.cmd.as_str() {
            "log" => {
                let id = self.one_id(a)?;
                let terms = num_list(&a.req("terms")?)?;
                let entries: Vec<Entry> = terms
                    .iter()
                    .enumerate()
                    .map(|(i, &term)| {
                        let index = i as u64 + 1;
                        Entry {
                            term,
                            index,
                            payload: Payload::Normal(format!("{index}@{term}").into_bytes().into()),
                        }
                    })
                    .collect();
                let last_term = terms.last().copied().unwrap_or(0);
                let hard_state = HardState {
                    term: a.u64_or("term", last_term)?,
                    vote: a.key("vote").map(|v| opt_num(&v)).transpose()?.flatten(),
                    commit: a.u64_or("commit", 0)?,
                };
                let durable = RestoredState {
                    hard_state,
                    snapshot: None,
                    entries,
                    repair_until: None,
                };
                let node = self.node(id)?;
                let (cfg, restarts) = (node.cfg.clone(), node.restarts + 1);
                let node = Node::start(cfg, self.now_ms, durable, restarts);
                self.nodes.insert(id, node);
                self.process_ready(id)?;
            }
            "campaign" => {
                for id in self.ids(&a.pos("nodes")?)? {
                    self.raft_mut(id)?.campaign();
                    self.process_ready(id)?;
                }
            }
            "peer-down" | "leader-seen" | "observe-term" | "step-down" => {
                let ids = self.ids(&a.pos("nodes")?)?;
                let now = self.now_ms;
                let (peer, term) = match a.cmd.as_str() {
                    "peer-down" => (num(&a.req("peer")?)?, 0),
                    "leader-seen" => (num(&a.req("leader")?)?, num(&a.req("term")?)?),
                    "observe-term" => (0, num(&a.req("term")?)?),
                    _ => (0, 0),
                };
                for id in ids {
                    let r = self.raft_mut(id)?;
                    match a.cmd.as_str() {
                        "peer-down" => r.peer_down(now, peer),
                        "leader-seen" => r.leader_seen_out_of_band(now, peer, term),
                        "observe-term" => r.observe_term(now, term),
                        _ => r.step_down(),
                    }
                    self.process_ready(id)?;
                }
            }
            "tick" => {
                let ids = self.ids(&a.pos("nodes")?)?;
                self.now_ms += a.u64_or("ms", 0)?;
                let now = self.now_ms;
                for id in ids {
                    self.raft_mut(id)?.tick(now);
                    self.process_ready(id)?;
                }
            }
            "advance" | "run" => {
                let ms = num(&a.req("ms")?)?;
                let only = match a.key("nodes") {
                    Some(s) => Some(self.ids(&s)?),
                    None => None,
                };
                let settle = a.cmd == "run";
                if settle && only.is_some() {
                    return Err("`run` moves every node; use `advance nodes=..`".into());
                }
                self.run_clock(ms, only, settle)?;
            }
            "propose" => {
                let id = self.one_id(a)?;
                let data = a.pos("data")?;
                let count = a.u64_or("count", 1)?;
                let want_index = a.key("index").map(|s| num(&s)).transpose()?;
                let outcome = Outcome::parse(a)?;
                let mut last = None;
                for i in 0..count {
                    let payload = if count == 1 {
                        data.clone()
                    } else {
                        format!("{data}{}", i + 1)
                    };
                    let got = self.raft_mut(id)?.propose(payload.into_bytes());
                    last = outcome.check(got)?;
                    self.process_ready(id)?;
                }
                if let (Some(want), Some((index, _))) = (want_index, last) {
                    if want != index {
                        return Err(format!(
                            "expected the proposal at index {want}, got {index}"
                        ));
                    }
                }
            }
            "may-lead" => {
                // `may-lead NODES yes|no`: Raft::set_may_lead.
                let ids = self.ids(&a.pos("nodes")?)?;
                let may = match a.pos("yes|no")?.as_str() {
                    "yes" => true,
                    "no" => false,
                    other => return Err(format!("may-lead: {other:?} is not yes or no")),
                };
                for id in ids {
                    self.raft_mut(id)?.set_may_lead(may);
                    self.process_ready(id)?;
                }
            }
            "transfer" => {
                let id = self.one_id(a)?;
                let to = num(&a.req("to")?)?;
                let got = self.raft_mut(id)?.transfer_leadership(to);
                Outcome::parse(a)?.check(got)?;
                self.process_ready(id)?;
            }
            "add-learner" | "add-voter" | "remove" => {
                let id = self.one_id(a)?;
                let member = num(&a.req("id")?)?;
                let change = match a.cmd.as_str() {
                    "add-learner" => MembershipChange::AddLearner(member),
                    "add-voter" => MembershipChange::AddVoter(member),
                    _ => MembershipChange::Remove(member),
                };
                let want_index = a.key("index").map(|s| num(&s)).transpose()?;
                let got = self.raft_mut(id)?.propose_membership(change);
                let accepted = Outcome::parse(a)?.check(got)?;
                if let (Some(want), Some((index, _))) = (want_index, accepted) {
                    if want != index {
                        return Err(format!("expected the change at index {want}, got {index}"));
                    }
                }
                if accepted.is_some() && !self.nodes.contains_key(&member) {
                    // The operator starts the new host: empty disk, and it
                    // learns the membership from the leader.
                    let cfg = self.config(member, Vec::new());
                    let node = Node::start(cfg, self.now_ms, RestoredState::default(), 0);
                    self.nodes.insert(member, node);
                }
                self.process_ready(id)?;
            }
            "compact" => {
                let id = self.one_id(a)?;
                let applied = self.node(id)?.applied;
                let index = a.u64_or("index", applied)?;
                let got = self
                    .raft_mut(id)?
                    .compact(index, format!("state@{index}").into_bytes());
                if let Some(snap) = Outcome::parse(a)?.check(got)? {
                    // The caller persists the snapshot, then trims its log.
                    let n = self.node_mut(id)?;
                    n.snapshot_wanted = false; // answered
                    n.durable.entries.retain(|e| e.index > snap.index);
                    n.durable.snapshot = Some(snap);
                }
                self.process_ready(id)?;
            }
            "read-index" => {
                let id = self.one_id(a)?;
                let rid = num(&a.req("id")?)?;
                let got = self.raft_mut(id)?.read_index(rid);
                Outcome::parse(a)?.check(got)?;
                self.process_ready(id)?;
            }
            "stabilize" => {
                let nodes = match a.key("nodes") {
                    Some(s) => Some(self.ids(&s)?.into_iter().collect::<BTreeSet<_>>()),
                    None => None,
                };
                let types = a.key("types").map(|s| type_set(&s)).transpose()?;
                self.stabilize(nodes.as_ref(), types.as_ref())?;
            }
            "deliver" | "drop" => {
                let spec = a.opt_pos();
                let sel = Selector::parse(spec.as_deref(), a.key("type").as_deref())?;
                let count = a.key("count").map(|s| num(&s)).transpose()?;
                let msgs = self.take_messages(&sel, count.map(|c| c as usize));
                if let Some(c) = count {
                    if msgs.len() as u64 != c {
                        return Err(format!("only {} matching messages were queued", msgs.len()));
                    }
                } else if msgs.is_empty() {
                    return Err("no queued message matches".into());
                }
                for m in msgs {
                    if a.cmd == "drop" {
                        self.log_trace(|| format!("drop {}", describe(&m)));
                    } else {
                        self.deliver(m)?;
                    }
                }
            }
            "persist" => {
                for id in self.ids(&a.pos("nodes")?)? {
                    self.persist(id)?;
                }
            }
            "isolate" => {
                for id in self.ids(&a.pos("nodes")?)? {
                    self.isolated.insert(id);
                }
                let sel = Selector {
                    from: None,
                    to: None,
                    types: None,
                };
                let queued = self.take_messages(&sel, None);
                for m in queued {
                    self.send(m);
                }
            }
            "cut" => {
                let (x, y) = (num(&a.pos("a node")?)?, num(&a.pos("another node")?)?);
                self.cuts.insert((x.min(y), x.max(y)));
                let sel = Selector {
                    from: None,
                    to: None,
                    types: None,
                };
                let queued = self.take_messages(&sel, None);
                for m in queued {
                    self.send(m);
                }
            }
            "heal" => {
                self.isolated.clear();
                self.cuts.clear();
                self.losses.clear();
            }
            "lose" => {
                let spec = a.opt_pos();
                let sel = Selector::parse(spec.as_deref(), Some(&a.req("type")?))?;
                self.losses.push(sel);
            }
            "crash" => {
                for id in self.ids(&a.pos("nodes")?)? {
                    let n = self.node_mut(id)?;
                    if n.raft.is_none() {
                        return Err(format!("node {id} is already down"));
                    }
                    n.raft = None;
                    n.pending.clear();
                    n.held.clear();
                    n.read_states.clear();
                    n.snapshot_wanted = false;
                }
            }
            "restart" => {
                for id in self.ids(&a.pos("nodes")?)? {
                    let n = self.node(id)?;
                    if n.raft.is_some() {
                        return Err(format!("node {id} is running"));
                    }
                    let node = Node::start(
                        n.cfg.clone(),
                        self.now_ms,
                        n.durable.clone(),
                        n.restarts + 1,
                    );
                    self.nodes.insert(id, node);
                    self.process_ready(id)?;
                }
            }
            "expect" => self.expect(a)?,
            other => return Err(format!("unknown command `{other}`")),
        }
        Ok(())
    }

    fn expect(&mut self, a: &mut Args) -> Result<(), String> {
        let what = a.pos("what to check")?;
        if what == "queued" {
            let spec = a.opt_pos();
            let sel = Selector::parse(spec.as_deref(), a.key("type").as_deref())?;
            let want = num(&a.req("count")?)?;
            let got = self.net.iter().filter(|m| sel.matches(m)).count() as u64;
            if got != want {
                return Err(format!("expected {want} queued messages, found {got}"));
            }
            return Ok(());
        }
        if what == "read" {
            let id = self.one_id(a)?;
            let rid = num(&a.req("id")?)?;
            let want = opt_num(&a.req("index")?)?;
            let got = self
                .node(id)?
                .read_states
                .iter()
                .find(|r| r.request_id == rid)
                .map(|r| r.index);
            if got != want {
                return Err(format!(
                    "read {rid} on node {id}: expected index {}, got {}",
                    fmt_opt(want),
                    fmt_opt(got)
                ));
            }
            return Ok(());
        }
        let ids = self.ids(&a.pos("nodes")?)?;
        // expect_one only peeks at the rest, so check its shape here.
        let (values, keys): (usize, &[&str]) = match what.as_str() {
            "log" => (0, &["terms", "first"]),
            "durable" => (0, &["terms", "first", "term", "vote", "commit"]),
            "snapshot" => (0, &["index", "term"]),
            "stat" => (0, &[]),
            _ => (1, &[]),
        };
        if a.pos.len() != values {
            return Err(format!(
                "`expect {what}` takes {values} value(s) after the nodes"
            ));
        }
        if what == "stat" {
            if a.keys.len() != 1 {
                return Err("`expect stat` takes exactly one NAME=VALUE".into());
            }
        } else if let Some(k) = a.keys.keys().find(|k| !keys.contains(&k.as_str())) {
            return Err(format!("unknown key `{k}=` for `expect {what}`"));
        }
        let mut failures = Vec::new();
        for id in ids {
            let (want, got) = self.expect_one(&what, id, a)?;
            if want != got {
                failures.push(format!("node {id}: {what} expected {want}, got {got}"));
            }
        }
        a.pos.clear();
        a.keys.clear();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.join("\n  "))
        }
    }

    /// Returns (expected, actual) renderings of one expectation on node
    /// `id`. Peeks at the arguments so the same ones serve every node.
    fn expect_one(&self, what: &str, id: NodeId, a: &Args) -> Result<(String, String), String> {
        let arg = || {
            a.pos
                .front()
                .cloned()
                .ok_or_else(|| format!("`expect {what}` needs a value"))
        };
        let key = |k: &str| a.keys.get(k).cloned();
        let r = || self.raft(id);
        Ok(match what {
            "role" => (arg()?, role_name(r()?.role()).to_string()),
            "term" => (num(&arg()?)?.to_string(), r()?.term().to_string()),
            "vote" => (fmt_opt(opt_num(&arg()?)?), fmt_opt(r()?.vote())),
            "leader" => (fmt_opt(opt_num(&arg()?)?), fmt_opt(r()?.leader())),
            "commit" => (num(&arg()?)?.to_string(), r()?.commit_index().to_string()),
            "applied" => (
                num(&arg()?)?.to_string(),
                self.node(id)?.applied.to_string(),
            ),
            "transfer" => (fmt_opt(opt_num(&arg()?)?), fmt_opt(r()?.transfer_target())),
            "voters" => (
                fmt_list(num_list(&arg()?)?),
                fmt_list(r()?.membership().voters.iter().copied()),
            ),
            "learners" => (
                fmt_list(num_list(&arg()?)?),
                fmt_list(r()?.membership().learners.iter().copied()),
            ),
            "snapshot-wanted" => (
                boolean(&arg()?)?.to_string(),
                self.node(id)?.snapshot_wanted.to_string(),
            ),
            "log" => {
                let want_first = key("first").map_or(Ok(1), |s| num(&s))?;
                let want = num_list(&key("terms").ok_or("`expect log` needs terms=")?)?;
                let raft = r()?;
                let terms = raft.entries_from(raft.first_index()).map(|e| e.term);
                (
                    format!("first={want_first} terms={}", fmt_list(want)),
                    format!("first={} terms={}", raft.first_index(), fmt_list(terms)),
                )
            }
            "durable" => {
                let d = &self.node(id)?.durable;
                let first = d.snapshot.as_ref().map_or(1, |s| s.index + 1);
                let mut want = String::new();
                let mut got = String::new();
                if let Some(t) = key("terms") {
                    let f = key("first").map_or(Ok(1), |s| num(&s))?;
                    want += &format!("first={f} terms={} ", fmt_list(num_list(&t)?));
                    got += &format!(
                        "first={first} terms={} ",
                        fmt_list(d.entries.iter().map(|e| e.term))
                    );
                }
                let hs = d.hard_state;
                if let Some(t) = key("term") {
                    want += &format!("term={} ", num(&t)?);
                    got += &format!("term={} ", hs.term);
                }
                if let Some(v) = key("vote") {
                    want += &format!("vote={} ", fmt_opt(opt_num(&v)?));
                    got += &format!("vote={} ", fmt_opt(hs.vote));
                }
                if let Some(c) = key("commit") {
                    want += &format!("commit={} ", num(&c)?);
                    got += &format!("commit={} ", hs.commit);
                }
                if want.is_empty() {
                    return Err("`expect durable` needs terms=, term=, vote= or commit=".into());
                }
                (want, got)
            }
            "snapshot" => {
                let snap = r()?.snapshot();
                let want_index = opt_num(&key("index").ok_or("`expect snapshot` needs index=")?)?;
                let mut want = format!("index={}", fmt_opt(want_index));
                let mut got = format!("index={}", fmt_opt(snap.map(|s| s.index)));
                if let Some(t) = key("term") {
                    want += &format!(" term={}", num(&t)?);
                    got += &format!(" term={}", fmt_opt(snap.map(|s| s.term)));
                }
                (want, got)
            }
            "stat" => {
                let (name, value) = a
                    .keys
                    .iter()
                    .next()
                    .ok_or("`expect stat` needs NAME=VALUE")?;
                let s = r()?.stats();
                let got = match name.as_str() {
                    "elections_started" => s.elections_started,
                    "leaderships_won" => s.leaderships_won,
                    "check_quorum_step_downs" => s.check_quorum_step_downs,
                    "snapshots_sent" => s.snapshots_sent,
                    "snapshots_installed" => s.snapshots_installed,
                    "fast_campaigns" => s.fast_campaigns,
                    "out_of_band_leader_contacts" => s.out_of_band_leader_contacts,
                    "out_of_band_step_downs" => s.out_of_band_step_downs,
                    "disk_stall_step_downs" => s.disk_stall_step_downs,
                    "repair_step_downs" => s.repair_step_downs,
                    "preferred_leader_transfers" => s.preferred_leader_transfers,
                    "preferred_leader_transfers_failed" => s.preferred_leader_transfers_failed,
                    other => return Err(format!("unknown stat `{other}`")),
                };
                (format!("{name}={}", num(value)?), format!("{name}={got}"))
            }
            other => return Err(format!("unknown expectation `{other}`")),
        })
    }

    // ----- checkers ----------------------------------------------------------

    fn check_invariants(&mut self) -> Result<(), String> {
        let live = self.live();
        // Election safety (thesis §3.6.3, figure 3.2).
        for &id in &live {
            let raft = self.raft(id)?;
            if raft.role() == Role::Leader {
                let term = raft.term();
                match self.leaders.get(&term) {
                    Some(&other) if other != id => {
                        return Err(format!(
                            "election safety violated: nodes {other} and {id} both led term {term}"
                        ));
                    }
                    _ => {
                        self.leaders.insert(term, id);
                    }
                }
            }
        }
        // Log matching: same index and term means same prefix.
        for (i, &x) in live.iter().enumerate() {
            for &y in &live[i + 1..] {
                let (a, b) = (self.raft(x)?, self.raft(y)?);
                let hi = a.last_index().min(b.last_index());
                let lo = a.first_index().max(b.first_index());
                let same = (lo..=hi)
                    .rev()
                    .find(|&k| a.term_at(k).is_some() && a.term_at(k) == b.term_at(k));
                if let Some(top) = same {
                    for k in lo..=top {
                        if a.entry(k) != b.entry(k) {
                            return Err(format!(
                                "log matching violated: nodes {x} and {y} agree on the term \
                                 of {top} but differ at {k}: {:?} vs {:?}",
                                a.entry(k),
                                b.entry(k)
                            ));
                        }
                    }
                }
            }
        }
        // Leader completeness: the newest leader holds every applied entry.
        let newest = live
            .iter()
            .filter_map(|&id| self.raft(id).ok().filter(|r| r.role() == Role::Leader))
            .max_by_key(|r| r.term());
        if let Some(leader) = newest {
            for (&index, e) in &self.applied {
                if index >= leader.first_index() && leader.entry(index) != Some(e) {
                    return Err(format!(
                        "leader completeness violated: leader {} (term {}) lacks applied \
                         entry {index}@{}",
                        leader.id(),
                        leader.term(),
                        e.term
                    ));
                }
            }
        }
        Ok(())
    }

    /// Once quiet, a node's disk must say exactly what its memory says.
    fn check_durable(&self, ids: &[NodeId]) -> Result<(), String> {
        for &id in ids {
            let node = self.node(id)?;
            let Some(raft) = node.raft.as_ref() else {
                continue;
            };
            let d = &node.durable;
            let disk: Vec<(Index, Term)> = d.entries.iter().map(|e| (e.index, e.term)).collect();
            let mem: Vec<(Index, Term)> = raft
                .entries_from(raft.first_index())
                .map(|e| (e.index, e.term))
                .collect();
            let disk_snap = d.snapshot.as_ref().map(|s| s.index);
            let mem_snap = raft.snapshot().map(|s| s.index);
            if disk != mem || disk_snap != mem_snap || d.hard_state != raft.hard_state() {
                return Err(format!(
                    "node {id}: durable state differs from memory after stabilize:\n    \
                     disk:   snapshot={} {:?} {disk:?}\n    memory: snapshot={} {:?} {mem:?}",
                    fmt_opt(disk_snap),
                    d.hard_state,
                    fmt_opt(mem_snap),
                    raft.hard_state()
                ));
            }
        }
        Ok(())
    }

    fn dump(&self) -> String {
        let mut out = format!(
            "  now={} ms, isolated={}\n",
            self.now_ms,
            fmt_list(self.isolated.iter().copied())
        );
        for (id, n) in &self.nodes {
            let d = &n.durable;
            let dsnap = d.snapshot.as_ref().map(|s| s.index);
            let dfirst = dsnap.map_or(1, |i| i + 1);
            let disk = format!(
                "durable: term={} vote={} commit={} snapshot={} log(first={dfirst})={}",
                d.hard_state.term,
                fmt_opt(d.hard_state.vote),
                d.hard_state.commit,
                fmt_opt(dsnap),
                fmt_list(d.entries.iter().map(|e| e.term))
            );
            match &n.raft {
                None => out += &format!("  node {id}: DOWN\n      {disk}\n"),
                Some(r) => {
                    let m = r.membership();
                    out += &format!(
                        "  node {id}: {} term={} vote={} leader={} commit={} persisted={} \
                         applied={} snapshot={} log(first={})={}\n      voters={} learners={} \
                         pending_writes={} held_msgs={} reads={:?} snapshot_wanted={}\n      {disk}\n",
                        role_name(r.role()),
                        r.term(),
                        fmt_opt(r.vote()),
                        fmt_opt(r.leader()),
                        r.commit_index(),
                        r.persisted_index(),
                        n.applied,
                        fmt_opt(r.snapshot().map(|s| s.index)),
                        r.first_index(),
                        fmt_list(r.entries_from(r.first_index()).map(|e| e.term)),
                        fmt_list(m.voters.iter().copied()),
                        fmt_list(m.learners.iter().copied()),
                        n.pending.len(),
                        n.held.len(),
                        n.read_states
                            .iter()
                            .map(|s| (s.request_id, s.index))
                            .collect::<Vec<_>>(),
                        n.snapshot_wanted,
                    );
                }
            }
        }
        out += &format!("  network ({} queued):\n", self.net.len());
        for m in &self.net {
            out += &format!("    {}\n", describe(m));
        }
        out
    }
}
