//! The simulated world: nodes with one replica and one disk per group, the
//! network, clients, the fault schedule, and the event loop that drives
//! the sans-IO cores through the same `Ready` contract a real driver uses.

use super::checker::{Checker, Violation};
use super::client::{Client, Operation, Outcome};
use super::device::SimDir;
use super::disk::{Durable, SimDisk};
use super::endpoint_net::EndpointNet;
use super::faults::FaultCounts;
use super::glue::{Answers, Hosted};
use super::net::Network;
use super::serial::{Cables, Watch};
use super::trace::{describe, Record, Trace, What};
use super::workload::{
    StateClient, StateOp, StateResult, Workload, LEDGER_CLIENTS_PER_GROUP, QUEUE_CLIENTS_PER_GROUP,
};
use super::{Net, RunReport, SimOptions};
use crate::consensus::{Body, Message, NodeId, Raft, RaftConfig};
use crate::heartbeat::Heartbeat;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;

/// Everything a seed decides about the environment.
#[derive(Clone, Debug)]
pub(crate) struct Params {
    pub(crate) election_timeout_ms: u64,
    pub(crate) heartbeat_ms: u64,
    pub(crate) net_delay_min_ms: u64,
    pub(crate) net_jitter_ms: u64,
    /// Share of messages held up on a clogged path (TigerBeetle's term).
    pub(crate) net_clog_probability: f64,
    pub(crate) disk_latency_min_ms: u64,
    pub(crate) disk_jitter_ms: u64,
    pub(crate) disk_spike_probability: f64,
    pub(crate) snapshot_entries: u64,
    pub(crate) append_bytes_max: usize,
    pub(crate) inflight_msgs_max: usize,
    pub(crate) fault_gap_ms_max: u64,
    /// Chance that a node crashes right after granting a vote (a targeted
    /// fault, as FoundationDB's BUGGIFY places faults at risky moments).
    pub(crate) crash_after_vote_probability: f64,
    /// Chance that a crash leaves bit rot in a group's log on that node.
    pub(crate) corruption_probability: f64,
    /// Chance that a completed write actually landed elsewhere.
    pub(crate) misdirected_write_probability: f64,
    pub(crate) clients_per_group: usize,
    /// The core's options are explored too, not only the defaults.
    pub(crate) pre_vote: bool,
    pub(crate) check_quorum: bool,
}

impl Params {
    fn from_rng(rng: &mut ChaCha8Rng) -> Self {
        let election_timeout_ms = rng.gen_range(100..=300);
        Params {
            election_timeout_ms,
            heartbeat_ms: election_timeout_ms / rng.gen_range(3..=6),
            net_delay_min_ms: rng.gen_range(1..=3),
            net_jitter_ms: rng.gen_range(0..=15),
            net_clog_probability: rng.gen_range(0.0..0.05),
            disk_latency_min_ms: rng.gen_range(1..=3),
            disk_jitter_ms: rng.gen_range(0..=8),
            disk_spike_probability: rng.gen_range(0.0..0.03),
            snapshot_entries: rng.gen_range(20..=200),
            append_bytes_max: rng.gen_range(64..=4096),
            inflight_msgs_max: rng.gen_range(1..=16),
            fault_gap_ms_max: rng.gen_range(150..=900),
            crash_after_vote_probability: rng.gen_range(0.0..0.3),
            corruption_probability: rng.gen_range(0.0..0.3),
            misdirected_write_probability: rng.gen_range(0.0..0.002),
            clients_per_group: rng.gen_range(1..=3),
            pre_vote: rng.gen_bool(0.6),
            check_quorum: rng.gen_bool(0.6),
        }
    }
}

#[derive(Debug)]
pub(crate) enum Event {
    Deliver {
        group: usize,
        msg: Message,
    },
    /// A transport datagram arrives (`Net::Endpoint`).
    Datagram {
        from: usize,
        to: usize,
        bytes: Vec<u8>,
    },
    /// A node's endpoint asked to be woken at `at_ms` (`Net::Endpoint`);
    /// stale once a sooner wake-up replaced it or the node crashed.
    EndpointTimer {
        node: usize,
        at_ms: u64,
    },
    Client {
        client: usize,
        generation: u64,
    },
    /// Bytes arrive at one end of a client's connection (`sim::pipe`).
    Pipe {
        client: super::pipe::Caller,
        node: usize,
        conn: u64,
        to_server: bool,
        bytes: Vec<u8>,
    },
    /// A state-machine client's timer (ledger and queue workloads).
    StateClient {
        client: usize,
        generation: u64,
    },
    Fault,
    RestartNode {
        node: usize,
    },
    /// Crash now, restart within a few ms (a targeted fault).
    CrashRestart {
        node: usize,
    },
    /// The node keeps crashing and restarting quickly until `until_ms`.
    CrashLoop {
        node: usize,
        until_ms: u64,
    },
    Heal,
    /// Space returns on a production replica's device.
    DiskSpace {
        node: usize,
        group: usize,
    },
    /// A production replica's device completes a request, or one of its
    /// jobs is due.
    Wake {
        node: usize,
        group: usize,
    },
    /// A node sends its heartbeat on both channels.
    HeartbeatSend {
        node: usize,
    },
    /// A heartbeat datagram arrives.
    HeartbeatUdp {
        to: usize,
        hb: Box<Heartbeat>,
    },
    /// Bytes arrive at one end of a serial cable.
    HeartbeatSerial {
        from: usize,
        to: usize,
        bytes: Vec<u8>,
    },
}

pub(crate) struct Node {
    pub(crate) alive: bool,
    /// The shadows of the real logs: what the checkers hold each to.
    pub(crate) disks: Vec<SimDisk>,
    /// The production replicas, and their devices.
    pub(crate) hosted: Vec<Option<Hosted>>,
    pub(crate) devices: Vec<SimDir>,
}

pub(crate) struct World {
    pub(crate) seed: u64,
    pub(crate) opts: SimOptions,
    pub(crate) p: Params,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) now: u64,
    queue: BTreeMap<(u64, u64), Event>,
    seq: u64,
    pub(crate) nodes: Vec<Node>,
    pub(crate) net: Network,
    pub(crate) cables: Cables,
    /// Per node while it is up: its heartbeat state and failure detector.
    pub(crate) watches: Vec<Option<Watch>>,
    pub(crate) serial_frame_errors: u64,
    pub(crate) detector_transitions: u64,
    /// Scripted runs keep leader changes, detector transitions and faults.
    pub(crate) observed: Option<Vec<Record>>,
    pub(crate) checker: Checker,
    pub(crate) clients: Vec<Client>,
    pub(crate) trace: Trace,
    pub(crate) faults: FaultCounts,
    pub(crate) healed_at: Option<u64>,
    pub(crate) recovered: Vec<bool>,
    /// Every completed client operation, in completion order.
    pub(crate) history: Vec<Operation>,
    /// Clients of the ledger and queue workloads.
    pub(crate) state_clients: Vec<StateClient>,
    /// Their completed operations, in completion order.
    pub(crate) state_history: Vec<StateOp>,
    /// Per group: ids of the ledgers created, in creation order (the
    /// metadata store through which readers find others' ledgers).
    pub(crate) ledger_directory: Vec<Vec<u64>>,
    pub(crate) dropped: u64,
    /// The nodes' transport endpoints (`Net::Endpoint` only).
    pub(crate) endpoint_net: Option<EndpointNet>,
    /// Stats of replicas that crashed, so counters survive restarts.
    pub(crate) retired_elections: u64,
    pub(crate) retired_snapshots: u64,
    pub(crate) retired_preferred_handovers: u64,
    /// The production glue's counts: recoveries and snapshots as they
    /// happen, the WAL counters of replicas that have stopped.
    pub(crate) glue: super::glue::GlueCounts,
    pub(crate) leaders: u64,
    /// Answers of the production replicas to clients' requests.
    pub(crate) answers: Answers,
    /// The caller of each ticketed append in flight, by (node, connection,
    /// request id): the replicas answer appends by ticket, as for the
    /// daemon's loop-served connections.
    pub(crate) ticket_callers: BTreeMap<(usize, u64, u64), super::pipe::Caller>,
    /// The last client operation id given out.
    pub(crate) next_op: u64,
    /// What the log clients' retries did.
    pub(crate) client_counts: super::client::ClientCounts,
}

/// Durable images of one group on every node.
pub(crate) fn durables(nodes: &[Node], g: usize) -> Vec<&Durable> {
    nodes.iter().map(|n| &n.disks[g].durable).collect()
}

/// Node index (0-based) of a node id.
pub(crate) fn idx(id: NodeId) -> usize {
    (id - 1) as usize
}

impl World {
    pub(crate) fn new(seed: u64, opts: &SimOptions) -> Self {
        Self::build(seed, opts, false)
    }

    /// A world without the random fault schedule, for scripted runs: the
    /// caller injects faults itself. It runs the production defaults
    /// (pre-vote and check-quorum on) on a clean network and disks: no
    /// clogs, no targeted crashes, no damage.
    pub(crate) fn scripted(seed: u64, opts: &SimOptions) -> Self {
        Self::build(seed, opts, true)
    }

    fn build(seed: u64, opts: &SimOptions, scripted: bool) -> Self {
        // The production replicas log an EIO stop as the daemon would.
        crate::node::log::quiet_on_this_thread();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut p = Params::from_rng(&mut rng);
        if scripted {
            p.pre_vote = true;
            p.check_quorum = true;
            p.net_clog_probability = 0.0;
            p.disk_spike_probability = 0.0;
            p.crash_after_vote_probability = 0.0;
            p.corruption_probability = 0.0;
            p.misdirected_write_probability = 0.0;
        }
        let n = opts.nodes;
        let mut w = World {
            seed,
            opts: opts.clone(),
            p,
            rng,
            now: 0,
            queue: BTreeMap::new(),
            seq: 0,
            nodes: Vec::new(),
            net: Network::new(n),
            cables: Cables::new(n),
            watches: Vec::new(),
            serial_frame_errors: 0,
            detector_transitions: 0,
            observed: None,
            checker: Checker::new(opts.groups, n),
            clients: Vec::new(),
            trace: Trace::new(opts.recent_events),
            faults: FaultCounts::default(),
            healed_at: None,
            recovered: vec![false; opts.groups],
            history: Vec::new(),
            state_clients: Vec::new(),
            state_history: Vec::new(),
            ledger_directory: vec![Vec::new(); opts.groups],
            dropped: 0,
            endpoint_net: None,
            retired_elections: 0,
            retired_snapshots: 0,
            retired_preferred_handovers: 0,
            glue: Default::default(),
            leaders: 0,
            answers: Answers::default(),
            ticket_callers: BTreeMap::new(),
            next_op: 0,
            client_counts: Default::default(),
        };
        for node in 0..n {
            let devices = (0..opts.groups).map(|g| w.new_device(node, g)).collect();
            w.nodes.push(Node {
                alive: true,
                disks: (0..opts.groups).map(|_| SimDisk::default()).collect(),
                hosted: (0..opts.groups).map(|_| None).collect(),
                devices,
            });
            for g in 0..opts.groups {
                w.start_hosted(node, g)
                    .expect("an empty device opens as an empty log");
            }
        }
        for node in 0..n {
            let epoch = w.rng.gen();
            w.watches.push(Some(Watch::new(node, n, 0, epoch)));
            let at = w.rng.gen_range(0..50);
            w.schedule(at, Event::HeartbeatSend { node });
        }
        let state_clients = match opts.workload {
            Workload::Log => 0,
            Workload::Ledger => LEDGER_CLIENTS_PER_GROUP,
            Workload::Queue => QUEUE_CLIENTS_PER_GROUP,
        };
        for g in 0..opts.groups {
            for _ in 0..state_clients {
                let id = w.state_clients.len();
                let guess = w.rng.gen_range(0..n);
                let client_seed = w.rng.gen();
                w.state_clients
                    .push(StateClient::new(id, g, guess, opts.workload, client_seed));
                let at = w.rng.gen_range(0..50);
                w.schedule(
                    at,
                    Event::StateClient {
                        client: id,
                        generation: 0,
                    },
                );
            }
        }
        let log_clients = if opts.workload == Workload::Log {
            w.p.clients_per_group
        } else {
            0
        };
        for g in 0..opts.groups {
            for _ in 0..log_clients {
                let id = w.clients.len();
                w.clients.push(Client::new(id, g, n));
                let at = w.rng.gen_range(0..50);
                w.schedule(
                    at,
                    Event::Client {
                        client: id,
                        generation: 0,
                    },
                );
            }
        }
        if !scripted {
            let first_fault = w.rng.gen_range(100..=w.p.fault_gap_ms_max);
            w.schedule(first_fault, Event::Fault);
            w.schedule(opts.fault_phase_ms, Event::Heal);
        }
        if opts.net == Net::Endpoint {
            // Drawn last, so the seed's parameters and schedule above are
            // the same under both nets.
            w.endpoint_net = Some(EndpointNet::new(seed, n));
            for node in 0..n {
                w.endpoint_start(node);
            }
        }
        w
    }

    pub(crate) fn raft_config(&self, node: usize, group: usize) -> RaftConfig {
        let voters = (1..=self.opts.nodes as u64).collect();
        let mut cfg = RaftConfig::new(node as u64 + 1, voters);
        cfg.election_timeout_ms = self.p.election_timeout_ms;
        cfg.heartbeat_interval_ms = self.p.heartbeat_ms;
        cfg.snapshot_entries = self.p.snapshot_entries;
        // Small chunks, so every snapshot sent is several InstallSnapshot
        // messages and their loss, reordering and duplication are tested.
        // The state workloads' snapshots are images: the state (tens of
        // kilobytes) and the log entries it refers to (hundreds, each a
        // position): bigger chunks, still tens of them, or a transfer
        // would rarely end between the faults.
        let state = self.opts.workload != Workload::Log;
        cfg.snapshot_chunk_bytes = if state { 4096 } else { 64 };
        cfg.snapshot_with_entries = state;
        cfg.append_bytes_max = self.p.append_bytes_max;
        cfg.inflight_msgs_max = self.p.inflight_msgs_max;
        cfg.pre_vote = self.p.pre_vote;
        cfg.check_quorum = self.p.check_quorum;
        cfg.planted_bug = self.opts.bug;
        // Leaders spread as quired spreads them; a hold of a few election
        // timeouts, so handovers back happen within a run's faults.
        cfg.preferred_leader_rank = Some(group as u64);
        cfg.preferred_leader_hold_ms = 5 * self.p.election_timeout_ms;
        // A few of this network's round trips, as an operator would set it.
        cfg.fast_campaign_jitter_ms = 2 * (self.p.net_delay_min_ms + self.p.net_jitter_ms) + 10;
        cfg
    }

    pub(crate) fn schedule(&mut self, at: u64, ev: Event) {
        self.seq += 1;
        self.queue.insert((at, self.seq), ev);
    }

    pub(crate) fn record(&mut self, node: usize, group: usize, what: What) {
        let r = Record {
            time_ms: self.now,
            node: node as u64 + 1,
            group,
            what,
        };
        if let Some(log) = self.observed.as_mut() {
            if matches!(
                what,
                What::BecameLeader { .. }
                    | What::Link { .. }
                    | What::PeerStatus { .. }
                    | What::PeerDiskStall { .. }
                    | What::Fault(_)
            ) {
                log.push(r);
            }
        }
        self.trace.record(r);
    }

    /// Runs to the end of the liveness phase, or to the first violation.
    pub(crate) fn run(&mut self) -> Result<(), Violation> {
        loop {
            let t = self.next_time();
            if let Some(h) = self.healed_at {
                if t > h + self.opts.liveness_bound_ms {
                    let stuck: Vec<usize> = (0..self.opts.groups)
                        .filter(|&g| !self.recovered[g])
                        .collect();
                    let repairing = self.repairing();
                    return Err(Violation {
                        invariant: "liveness-after-heal",
                        detail: format!(
                            "within {} ms of healing, groups {stuck:?} confirmed no new append and (node, group) {repairing:?} still miss log entries their states refer to",
                            self.opts.liveness_bound_ms
                        ),
                    });
                }
            }
            self.step()?;
            if self.healed_at.is_some()
                && self.recovered.iter().all(|&r| r)
                && self.repairing().is_empty()
            {
                return Ok(());
            }
        }
    }

    /// Runs every event and timer due up to `until_ms` (scripted runs).
    pub(crate) fn run_until(&mut self, until_ms: u64) -> Result<(), Violation> {
        while self.next_time() <= until_ms {
            self.step()?;
        }
        self.now = self.now.max(until_ms);
        Ok(())
    }

    /// When the next event or timer is due.
    fn next_time(&self) -> u64 {
        let next_event = self
            .queue
            .first_key_value()
            .map_or(u64::MAX, |(&(t, _), _)| t);
        next_event
            .min(self.next_tick().0)
            .min(self.next_detector_tick().0)
    }

    /// Handles the next event or timer, then hands what the endpoints
    /// have to send to the network (`Net::Endpoint`): the messages of one
    /// step share datagrams, as a daemon's drive does.
    fn step(&mut self) -> Result<(), Violation> {
        let r = self.step_one();
        self.endpoint_flush_all();
        r
    }

    fn step_one(&mut self) -> Result<(), Violation> {
        let next_event = self
            .queue
            .first_key_value()
            .map_or(u64::MAX, |(&(t, _), _)| t);
        let (tick_at, who) = self.next_tick();
        let (detector_at, watcher) = self.next_detector_tick();
        if detector_at < tick_at && detector_at <= next_event {
            self.now = self.now.max(detector_at);
            let n = watcher.expect("a deadline comes from a node");
            self.detector_tick(n)
        } else if tick_at <= next_event {
            self.now = self.now.max(tick_at);
            let (n, g) = who.expect("a deadline comes from a replica");
            self.record(n, g, What::Tick);
            let now = self.now;
            let raft = self.nodes[n].raft_mut(g).expect("ticked replica is live");
            raft.tick(now);
            assert!(
                raft.poll_timeout() > now,
                "n{} g{g}: tick at {now} did not move the deadline",
                n + 1
            );
            self.drive(n, g)
        } else {
            let ((t, _), ev) = self.queue.pop_first().expect("an event exists");
            self.now = t;
            self.handle(ev)
        }
    }

    fn next_tick(&self) -> (u64, Option<(usize, usize)>) {
        let mut best = (u64::MAX, None);
        for (n, node) in self.nodes.iter().enumerate() {
            if !node.alive {
                continue;
            }
            for g in 0..node.hosted.len() {
                if let Some(raft) = node.raft(g) {
                    let t = raft.poll_timeout();
                    if t < best.0 {
                        best = (t, Some((n, g)));
                    }
                }
            }
        }
        best
    }

    fn handle(&mut self, ev: Event) -> Result<(), Violation> {
        match ev {
            Event::Deliver { group, msg } => self.deliver(group, msg),
            Event::Datagram { from, to, bytes } => self.datagram_arrived(from, to, &bytes),
            Event::EndpointTimer { node, at_ms } => self.endpoint_timer(node, at_ms),
            Event::Client { client, generation } => self.client_event(client, generation),
            Event::Pipe {
                client,
                node,
                conn,
                to_server,
                bytes,
            } => self.pipe_arrived(client, node, conn, to_server, &bytes),
            Event::StateClient { client, generation } => {
                self.state_client_event(client, generation)
            }
            Event::Fault => self.inject_fault(),
            Event::RestartNode { node } => {
                if !self.nodes[node].alive {
                    self.restart_node(node)?;
                }
                Ok(())
            }
            Event::CrashRestart { node } => {
                if self.nodes[node].alive && self.healed_at.is_none() {
                    self.faults.crashes += 1;
                    self.crash_node(node)?;
                    let back = self.now + self.rng.gen_range(1..=10);
                    self.schedule_restart(node, back);
                }
                Ok(())
            }
            Event::CrashLoop { node, until_ms } => self.crash_loop_step(node, until_ms),
            Event::Heal => self.heal(),
            Event::Wake { node, group } => self.drive_hosted(node, group),
            Event::DiskSpace { node, group } => {
                self.nodes[node].devices[group].set_capacity_bytes(None);
                self.drive_hosted(node, group)
            }
            Event::HeartbeatSend { node } => self.heartbeat_send(node),
            Event::HeartbeatUdp { to, hb } => self.heartbeat_udp(to, &hb),
            Event::HeartbeatSerial { from, to, bytes } => self.heartbeat_serial(from, to, &bytes),
        }
    }

    /// Steps the receiver's Raft with a message that arrived, and drives it.
    pub(crate) fn deliver(&mut self, group: usize, msg: Message) -> Result<(), Violation> {
        let n = idx(msg.to);
        let live = self.nodes[n].alive && self.nodes[n].raft(group).is_some();
        if !live {
            return Ok(());
        }
        let (kind, detail) = describe(&msg);
        let (from, term) = (msg.from, msg.term);
        self.record(
            n,
            group,
            What::Deliver {
                from,
                kind,
                term,
                detail,
            },
        );
        let mut msg = msg;
        self.maybe_wrong_repair_copy(n, group, &mut msg);
        let now = self.now;
        let replica = self.nodes[n].replica_mut(group).expect("checked live");
        replica.step(now, msg);
        self.drive(n, group)
    }

    /// Runs one replica until it has nothing to say (`drive_hosted`).
    pub(crate) fn drive(&mut self, n: usize, g: usize) -> Result<(), Violation> {
        self.drive_hosted(n, g)
    }

    /// Sends a message through the simulated network.
    pub(crate) fn send(&mut self, g: usize, msg: Message) -> Result<(), Violation> {
        let (from, to) = (idx(msg.from), idx(msg.to));
        if self.opts.check_send_rule {
            self.checker
                .leaving(g, &msg, &self.nodes[from].disks[g].durable)?;
        }
        if to >= self.nodes.len() {
            return Ok(());
        }
        // A risky moment for a targeted crash: right after a vote is granted,
        // when forgetting it would let this node vote twice.
        let granted_vote = matches!(msg.body, Body::VoteResponse { granted: true });
        if granted_vote
            && self.healed_at.is_none()
            && self.rng.gen_bool(self.p.crash_after_vote_probability)
        {
            let at = self.now + self.rng.gen_range(0..=3);
            self.schedule(at, Event::CrashRestart { node: from });
        }
        if self.opts.net == Net::Endpoint {
            self.endpoint_send(g, &msg);
            return Ok(());
        }
        let arrivals = self.path_arrivals(from, to);
        if arrivals.times().is_empty() {
            self.dropped += 1;
            let kind = describe(&msg).0;
            self.record(
                from,
                g,
                What::Drop {
                    from: msg.from,
                    to: msg.to,
                    kind,
                },
            );
            return Ok(());
        }
        for &at in arrivals.times() {
            let msg = msg.clone();
            self.schedule(at, Event::Deliver { group: g, msg });
        }
        Ok(())
    }

    /// Crashes one group's replica on a node: its unsynced writes are
    /// partly lost or torn, and waiting clients learn nothing.
    pub(crate) fn stop_group(&mut self, n: usize, g: usize) -> Result<(), Violation> {
        self.stop_hosted(n, g)
    }

    /// Restarts one group's replica from its device.
    pub(crate) fn start_group(&mut self, n: usize, g: usize) -> Result<(), Violation> {
        self.start_hosted(n, g)
    }

    pub(crate) fn crash_node(&mut self, n: usize) -> Result<(), Violation> {
        self.record(n, 0, What::Crash);
        self.nodes[n].alive = false;
        self.watches[n] = None;
        self.endpoint_crash(n);
        for g in 0..self.opts.groups {
            // Damage on the device, where recovery can tell it: bit rot,
            // or now and then a write that never landed; in the state
            // workloads, half the time below the snapshot, where entries
            // the state refers to are repaired from a peer.
            let below = self.opts.workload != super::Workload::Log;
            let target = (self.rng.gen_bool(self.p.corruption_probability)
                && self.may_damage(n, g))
            .then(|| {
                let below = (below && self.rng.gen_bool(0.5))
                    .then(|| self.damage_below_target(n, g))
                    .flatten();
                below.or_else(|| self.damage_target(n, g))
            })
            .flatten();
            let misdirected = self.rng.gen_bool(0.2);
            self.stop_group(n, g)?;
            if let Some(target) = target {
                self.damage(n, g, target, misdirected);
            }
        }
        Ok(())
    }

    /// Disk damage stays within what Raft can survive: at most a minority
    /// of a group's replicas damaged or repairing at once (with more, no
    /// replication protocol keeps acknowledged data).
    fn may_damage(&self, n: usize, g: usize) -> bool {
        // Below the snapshot: while a live replica misses entries, or a
        // replica that is down has some not repaired (its state at the
        // snapshot may refer to them again when it starts).
        let damaged = |m: usize| {
            let d = &self.nodes[m].disks[g];
            let below = match &self.nodes[m].hosted[g] {
                Some(h) => h.replica.repair_stats().missing > 0,
                None => !d.unrepaired_below.is_empty(),
            };
            d.durable.is_damaged() || below
        };
        let others = (0..self.nodes.len())
            .filter(|&m| m != n && damaged(m))
            .count();
        others < (self.nodes.len() - 1) / 2 && !damaged(n)
    }

    pub(crate) fn restart_node(&mut self, n: usize) -> Result<(), Violation> {
        self.record(n, 0, What::Restart);
        self.nodes[n].alive = true;
        let epoch = self.rng.gen();
        let nodes = self.nodes.len();
        self.watches[n] = Some(Watch::new(n, nodes, self.now, epoch));
        self.schedule(self.now, Event::HeartbeatSend { node: n });
        // A new process: a new endpoint, with a new session epoch.
        self.endpoint_start(n);
        for g in 0..self.opts.groups {
            self.start_group(n, g)?;
            self.drive(n, g)?;
        }
        Ok(())
    }

    pub(crate) fn schedule_restart(&mut self, n: usize, at: u64) {
        self.schedule(at, Event::RestartNode { node: n });
    }

    pub(crate) fn report(&self) -> RunReport {
        let mut elections = self.retired_elections;
        let mut snapshots = self.retired_snapshots;
        let mut handovers = self.retired_preferred_handovers;
        for node in &self.nodes {
            for g in 0..node.hosted.len() {
                if let Some(raft) = node.raft(g) {
                    elections += raft.stats().elections_started;
                    snapshots += raft.stats().snapshots_sent;
                    handovers += raft.stats().preferred_leader_transfers;
                }
            }
        }
        let mut report = RunReport {
            seed: self.seed,
            trace_hash: self.trace.hash(),
            sim_time_ms: self.now,
            events: self.trace.events,
            elections,
            leaders: self.leaders,
            commits: (0..self.opts.groups)
                .map(|g| self.checker.committed_len(g))
                .sum(),
            confirmed: self.count(|o| matches!(o, Outcome::Ok(_))),
            failed: self.count(|o| o == Outcome::Failed),
            unknown: self.count(|o| o == Outcome::Unknown),
            snapshots_sent: snapshots,
            preferred_handovers: handovers,
            faults: self.faults,
            messages_dropped: self.dropped,
            detector_transitions: self.detector_transitions,
            serial_frame_errors: self.serial_frame_errors,
            invariant_checks: self.checker.checks,
            recovery_ms: self.healed_at.map_or(0, |h| self.now.saturating_sub(h)),
            glue: self.glue_counts(),
            client_retries: self.client_counts.retries,
            retries_deduplicated: self.checker.appends.deduplicated_count(),
            confirms_checked: self.client_counts.confirms_checked,
            confirms_unchecked: self.client_counts.confirms_unchecked,
            ..RunReport::default()
        };
        self.endpoint_report(&mut report);
        report
    }

    /// Client operations whose outcome `pred` accepts; in the ledger and
    /// queue workloads, state operations mapped onto the same outcomes
    /// (answered: Ok, unknown: Unknown).
    fn count(&self, pred: impl Fn(Outcome) -> bool) -> u64 {
        let log = self.history.iter().filter(|op| pred(op.outcome)).count();
        let state = self
            .state_history
            .iter()
            .filter(|op| {
                pred(match op.result {
                    StateResult::Unknown => Outcome::Unknown,
                    _ => Outcome::Ok(0),
                })
            })
            .count();
        (log + state) as u64
    }

    pub(crate) fn recent(&self) -> Vec<String> {
        self.trace.recent()
    }
}

impl World {
    /// Group `g`'s disk on node `n` completes nothing until `until_ms` (a
    /// stall runs its course, even past the heal: a disk does not take
    /// orders).
    pub(crate) fn stall_disk(&mut self, n: usize, g: usize, until_ms: u64) {
        self.nodes[n].devices[g].stall_until_us(until_ms * 1000);
    }

    /// The next sync of group `g`'s disk on node `n` fails with EIO.
    pub(crate) fn fail_next_sync(&mut self, n: usize, g: usize) {
        self.nodes[n].devices[g].fail_next_sync();
    }
}

impl Node {
    /// Group `g`'s Raft core here, if it runs.
    pub(crate) fn raft(&self, g: usize) -> Option<&Raft> {
        self.hosted[g].as_ref().map(|h| &h.replica.raft)
    }

    /// Group `g`'s Raft core here, to step or tick it.
    pub(crate) fn raft_mut(&mut self, g: usize) -> Option<&mut Raft> {
        self.hosted[g].as_mut().map(|h| &mut h.replica.raft)
    }

    /// Group `g`'s replica here, to step it.
    pub(crate) fn replica_mut(
        &mut self,
        g: usize,
    ) -> Option<&mut crate::node::replica::Replica<super::device::SimDir, super::host::ManualHost>>
    {
        self.hosted[g].as_mut().map(|h| &mut h.replica)
    }

    /// True if group `g` runs here (its log has not stopped).
    pub(crate) fn runs(&self, g: usize) -> bool {
        self.alive && self.raft(g).is_some()
    }
}
