//! The handle a caller (the daemon, a test) holds on a running node loop:
//! commands go in over a channel, answers come back over one.

use crate::consensus::{Index, NodeId, Term};
use crate::node::client::conns::{ClientPort, PortCommand};
use crate::node::command::{CoreCommand, ProposeError, QueryReply, ReadReply, Reply, StateReply};
use crate::node::errors::StartError;
use crate::node::log::{log_info, log_warn};
use crate::node::loops::event_loop::{EventLoop, NetPath};
use crate::node::loops::waker::Waker;
use crate::node::mesh::{CoreLink, CoreMailbox, CoreMsg, Routing, Wiring};
use crate::node::spec::NodeSpec;
use crate::node::status::NodeStatus;
use crate::transport::GroupId;
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Commands queued for one loop at most. The handle's callers wait for
/// room; a loop handing another a client request never waits (the
/// request is answered Busy instead).
pub(crate) const COMMANDS_QUEUED_MAX: usize = 16_384;

/// One core's loop.
struct CoreLoop {
    commands: Sender<CoreCommand>,
    /// For the client server: serve clients, or stop.
    ports: Sender<PortCommand>,
    waker: Waker,
    thread: Option<JoinHandle<()>>,
}

impl CoreLoop {
    /// Hands the loop a command and wakes it; gives the command back if
    /// the loop has stopped.
    fn send(&self, cmd: CoreCommand) -> Result<(), CoreCommand> {
        self.commands.send(cmd).map_err(|e| e.0)?;
        self.waker.wake();
        Ok(())
    }
}

/// A running node: one loop per core that owns groups.
pub struct NodeHandle {
    id: NodeId,
    cores: Vec<CoreLoop>,
    /// Which loop owns each group.
    owner: BTreeMap<GroupId, usize>,
    /// Counted by the client server, shown by the admin endpoint.
    clients: std::sync::Arc<crate::node::client::stats::ClientCounters>,
    /// The client server's quotas, once it has started with some.
    quotas: std::sync::Mutex<Option<std::sync::Arc<crate::node::client::quota::Quotas>>>,
}

impl NodeHandle {
    /// Runs the node's groups on one loop thread, not pinned.
    pub fn spawn(spec: NodeSpec) -> Result<NodeHandle, StartError> {
        Self::spawn_on(spec, &[])
    }

    /// Runs group `g` on core `cores[g % cores.len()]`, one loop thread
    /// per core that gets a group, each pinned to its core (an empty list:
    /// one loop, not pinned). The logs and sockets are opened on the loop
    /// threads themselves, which own them for good (an io_uring ring is
    /// never shared); errors name what could not be opened.
    pub fn spawn_on(spec: NodeSpec, cores: &[usize]) -> Result<NodeHandle, StartError> {
        spec.validate()?;
        let id = spec.id;
        let started = Instant::now();
        // Core -> its groups, in the order of the first group's core first.
        let mut plan: Vec<(Option<usize>, Vec<crate::node::spec::GroupSpec>)> = Vec::new();
        let mut groups = spec.groups.clone();
        groups.sort_by_key(|g| g.group);
        for g in groups {
            let core = (!cores.is_empty()).then(|| cores[g.group as usize % cores.len()]);
            match plan.iter_mut().find(|(c, _)| *c == core) {
                Some((_, gs)) => gs.push(g),
                None => plan.push((core, vec![g])),
            }
        }
        let mesh: Vec<(Sender<CoreMsg>, Receiver<CoreMsg>)> =
            plan.iter().map(|_| unbounded()).collect();
        let commands: Vec<(Sender<CoreCommand>, Receiver<CoreCommand>)> =
            plan.iter().map(|_| bounded(COMMANDS_QUEUED_MAX)).collect();
        let wakers = plan
            .iter()
            .map(|_| Waker::new())
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|error| StartError::Os {
                what: "creating a loop's eventfd",
                error,
            })?;
        let mailbox = |i: usize| CoreMailbox {
            tx: mesh[i].0.clone(),
            waker: wakers[i].clone(),
        };
        let mut owner = BTreeMap::new();
        for (i, (_, groups)) in plan.iter().enumerate() {
            for g in groups {
                owner.insert(g.group, i);
            }
        }
        let routing = Arc::new(Routing {
            owner: owner.clone(),
            cores: (0..plan.len())
                .map(|i| CoreLink {
                    commands: commands[i].0.clone(),
                    mail: mailbox(i),
                })
                .collect(),
        });
        let mut handle = NodeHandle {
            id,
            cores: Vec::new(),
            owner,
            clients: std::sync::Arc::default(),
            quotas: std::sync::Mutex::new(None),
        };
        let net = open_net_path(&spec, &plan)?;
        for (i, (core, groups)) in plan.into_iter().enumerate() {
            let wiring = if i == 0 {
                Wiring::Control((1..mesh.len()).map(mailbox).collect())
            } else {
                Wiring::Worker(mailbox(0))
            };
            let waker = wakers[i].clone();
            let inbox = mesh[i].1.clone();
            let core_spec = NodeSpec {
                groups,
                ..spec.clone()
            };
            let (tx, rx) = commands[i].clone();
            let (ports_tx, ports_rx) = bounded(4);
            let routing = Arc::clone(&routing);
            let (opened_tx, opened) = bounded(1);
            let net = net.clone();
            let name = match core {
                Some(c) => format!("quire-n{id}-core{c}"),
                None => format!("quire-n{id}"),
            };
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    if let Some(c) = core {
                        if !core_affinity::set_for_current(core_affinity::CoreId { id: c }) {
                            log_warn!(
                                "node {id}: could not pin a loop to core {c}; it runs unpinned"
                            );
                        }
                    }
                    let opened_loop = EventLoop::open(
                        core_spec, started, i, rx, inbox, wiring, waker, routing, ports_rx, net,
                    );
                    match opened_loop {
                        Ok(mut ev) => {
                            let _ = opened_tx.send(Ok(()));
                            ev.run();
                        }
                        Err(e) => {
                            let _ = opened_tx.send(Err(e));
                        }
                    }
                })
                .map_err(|error| StartError::Os {
                    what: "starting a node thread",
                    error,
                })?;
            let opened = opened.recv().unwrap_or(Err(StartError::LoopDied));
            handle.cores.push(CoreLoop {
                commands: tx,
                ports: ports_tx,
                waker: wakers[i].clone(),
                thread: Some(thread),
            });
            // On failure, dropping the handle stops the loops already started.
            opened?;
        }
        Ok(handle)
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Proposes `data` to `group` and waits up to `timeout` for it to be
    /// applied here.
    pub fn propose(
        &self,
        group: GroupId,
        data: Vec<u8>,
        timeout: Duration,
    ) -> Result<Index, ProposeError> {
        self.call(group, timeout, |reply| CoreCommand::Propose {
            group,
            data,
            reply,
        })
    }

    /// Appends `data` as client `client_id`'s append number `seq` and
    /// waits up to `timeout` for it to be applied here. A retry with the
    /// same id and seq is applied only once and answered with the index
    /// of the first.
    pub fn append(
        &self,
        group: GroupId,
        client_id: u64,
        seq: u64,
        data: Vec<u8>,
        timeout: Duration,
    ) -> Result<Index, ProposeError> {
        self.call(group, timeout, |reply| CoreCommand::Append {
            group,
            client_id,
            seq,
            data,
            reply,
        })
    }

    /// Sends the command `make` builds to the loop owning `group` and
    /// waits up to `timeout` for its answer.
    fn call<T: Send + 'static>(
        &self,
        group: GroupId,
        timeout: Duration,
        make: impl FnOnce(Box<dyn FnOnce(Result<T, ProposeError>) + Send>) -> CoreCommand,
    ) -> Result<T, ProposeError> {
        let (tx, answer) = bounded(1);
        let reply: Box<dyn FnOnce(Result<T, ProposeError>) + Send> = Box::new(move |r| {
            let _ = tx.send(r);
        });
        self.submit(group, make(reply))?;
        answer
            .recv_timeout(timeout)
            .unwrap_or(Err(ProposeError::Timeout))
    }

    /// Hands a command to the loop owning `group` without waiting; if it
    /// cannot be handed over, its caller is answered here at once.
    fn dispatch(&self, group: GroupId, cmd: CoreCommand) {
        match self.owner.get(&group) {
            Some(&core) => {
                if let Err(cmd) = self.cores[core].send(cmd) {
                    cmd.fail(ProposeError::Stopping);
                }
            }
            None => cmd.fail(ProposeError::UnknownGroup(group)),
        }
    }

    /// Hands a command to the loop owning `group` without waiting: its
    /// reply callback runs on that loop when the outcome is known.
    fn submit(&self, group: GroupId, cmd: CoreCommand) -> Result<(), ProposeError> {
        let Some(&core) = self.owner.get(&group) else {
            return Err(ProposeError::UnknownGroup(group));
        };
        self.cores[core]
            .send(cmd)
            .map_err(|_| ProposeError::Stopping)
    }

    /// `append` without waiting: `reply` is called on the group's loop
    /// once the outcome is known (for pipelining servers). If the command
    /// cannot even be handed over, `reply` is called here at once.
    pub fn append_with(
        &self,
        group: GroupId,
        client_id: u64,
        seq: u64,
        data: Vec<u8>,
        reply: Reply,
    ) {
        let cmd = CoreCommand::Append {
            group,
            client_id,
            seq,
            data,
            reply,
        };
        self.dispatch(group, cmd);
    }

    /// Proposes a ledger or queue command as client `client_id`'s request
    /// `seq` (0: no deduplication), without waiting: `reply` gets the
    /// outcome once it is applied here. A retry with the same id and seq
    /// is applied once and answered with the first outcome.
    pub fn state_with(
        &self,
        group: GroupId,
        client_id: u64,
        seq: u64,
        command: crate::state::Command,
        reply: StateReply,
    ) {
        let cmd = CoreCommand::State {
            group,
            client_id,
            seq,
            command,
            reply,
        };
        self.dispatch(group, cmd);
    }

    /// `state_with`, waiting up to `timeout` for the outcome.
    pub fn state(
        &self,
        group: GroupId,
        client_id: u64,
        seq: u64,
        command: crate::state::Command,
        timeout: Duration,
    ) -> Result<crate::state::Outcome, ProposeError> {
        self.call(group, timeout, |reply| CoreCommand::State {
            group,
            client_id,
            seq,
            command,
            reply,
        })
    }

    /// Answers a query on the leader, linearizably (a read index round),
    /// without waiting: `reply` gets the answer.
    pub fn query_with(&self, group: GroupId, query: crate::state::Query, reply: QueryReply) {
        self.query_waiting(group, query, 0, reply);
    }

    /// `query_with`, except that a `ReadLedger` finding nothing past the
    /// LAC waits up to `wait_ms` for an entry to be confirmed (a long
    /// poll, answered as soon as one is, or empty at the end).
    pub fn query_waiting(
        &self,
        group: GroupId,
        query: crate::state::Query,
        wait_ms: u32,
        reply: QueryReply,
    ) {
        self.dispatch(
            group,
            CoreCommand::Query {
                group,
                query,
                wait_ms,
                reply,
            },
        );
    }

    /// `query_with`, waiting up to `timeout` for the answer.
    pub fn query(
        &self,
        group: GroupId,
        query: crate::state::Query,
        timeout: Duration,
    ) -> Result<crate::state::Answer, ProposeError> {
        self.call(group, timeout, |reply| CoreCommand::Query {
            group,
            query,
            wait_ms: 0,
            reply,
        })
    }

    /// Changes `group`'s membership (one server at a time: add a learner,
    /// promote a learner to voter, remove a member) and waits up to
    /// `timeout` for the change to be applied here; only the leader takes
    /// it (`NotLeader` otherwise). A promotion is refused unless the node
    /// is a learner within `LEARNER_CAUGHT_UP_ENTRIES_MAX` entries of the
    /// leader's last index (`Lagging`, or `Invalid` for a non-learner);
    /// `change_membership_with(.., force: true, ..)` skips that check.
    pub fn change_membership(
        &self,
        group: GroupId,
        change: crate::consensus::MembershipChange,
        timeout: Duration,
    ) -> Result<Index, ProposeError> {
        self.change_membership_with(group, change, false, timeout)
    }

    /// `change_membership`, with `force`: promote a learner however far
    /// behind it is, or add a non-member directly as a voter.
    pub fn change_membership_with(
        &self,
        group: GroupId,
        change: crate::consensus::MembershipChange,
        force: bool,
        timeout: Duration,
    ) -> Result<Index, ProposeError> {
        self.call(group, timeout, |reply| CoreCommand::Membership {
            group,
            change,
            force,
            reply,
        })
    }

    /// Hands `group`'s leadership to voter `to` and waits up to `timeout`
    /// for this node to hear from it as leader: the term it leads. Only
    /// the leader takes it (`NotLeader` otherwise); `Busy` if `to` did not
    /// take over within an election timeout (this node still leads) or
    /// another node won. The clients this node had waiting are sent to
    /// `to` at once (`ProposeError::SteppedDown`).
    pub fn transfer_leadership(
        &self,
        group: GroupId,
        to: NodeId,
        timeout: Duration,
    ) -> Result<Term, ProposeError> {
        self.call(group, timeout, |reply| CoreCommand::Transfer {
            group,
            to,
            reply,
        })
    }

    /// Committed entries of `group` from `from` on (at most `max_entries`,
    /// about `max_bytes`), without waiting: `reply` gets them. Linearizable
    /// unless `stale`: the leader answers after a read-index round (every
    /// entry committed before the call is in the answer), a follower with
    /// `NotLeader`. A `stale` read is this node's applied log, leader or
    /// not: it may miss entries committed but not yet applied here.
    pub fn read_with(
        &self,
        group: GroupId,
        from: Index,
        max_entries: usize,
        max_bytes: usize,
        stale: bool,
        reply: ReadReply,
    ) {
        self.read_waiting(group, from, max_entries, max_bytes, 0, stale, reply);
    }

    /// `read_with`, except that finding nothing committed from `from` on,
    /// it waits up to `wait_ms` for an entry to be (a tail, answered as
    /// soon as one is applied here, or empty at the end).
    #[allow(clippy::too_many_arguments)] // the fields of one wire request
    pub fn read_waiting(
        &self,
        group: GroupId,
        from: Index,
        max_entries: usize,
        max_bytes: usize,
        wait_ms: u32,
        stale: bool,
        reply: ReadReply,
    ) {
        let cmd = CoreCommand::Read {
            group,
            from,
            max_entries,
            max_bytes,
            wait_ms,
            stale,
            reply,
        };
        self.dispatch(group, cmd);
    }

    /// Committed entries of `group` from `from` on, waiting up to `timeout`
    /// for the answer; linearizable (`read_with`, not stale).
    pub fn read(
        &self,
        group: GroupId,
        from: Index,
        max_entries: usize,
        timeout: Duration,
    ) -> Result<Vec<(Index, Term, bytes::Bytes)>, ProposeError> {
        let (tx, answer) = bounded(1);
        self.read_with(
            group,
            from,
            max_entries,
            usize::MAX,
            false,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        answer
            .recv_timeout(timeout)
            .unwrap_or(Err(ProposeError::Timeout))
    }

    /// The groups this node runs.
    pub fn groups(&self) -> impl Iterator<Item = GroupId> + '_ {
        self.owner.keys().copied()
    }

    /// The node's state now, gathered from every loop; `None` if a loop
    /// has stopped.
    pub fn status(&self) -> Option<NodeStatus> {
        let mut merged: Option<NodeStatus> = None;
        for core in &self.cores {
            let (reply, answer) = bounded(1);
            core.send(CoreCommand::Status(reply)).ok()?;
            let s = answer.recv_timeout(Duration::from_secs(5)).ok()?;
            match merged.as_mut() {
                None => merged = Some(s),
                Some(m) => {
                    m.groups.extend(s.groups);
                    m.transitions.extend(s.transitions);
                    m.sends_refused += s.sends_refused;
                    m.mac_failures += s.mac_failures;
                    m.malformed_dropped += s.malformed_dropped;
                    m.stalls.merge(s.stalls);
                    m.net.extend(s.net);
                    for t in s.transport {
                        match m.transport.iter_mut().find(|x| x.peer == t.peer) {
                            Some(x) => {
                                x.datagrams_sent += t.datagrams_sent;
                                x.datagrams_received += t.datagrams_received;
                                x.nack_rounds += t.nack_rounds;
                                x.retransmits += t.retransmits;
                                if x.rtt_us == 0 {
                                    x.rtt_us = t.rtt_us;
                                }
                            }
                            None => m.transport.push(t),
                        }
                    }
                }
            }
        }
        if let Some(m) = merged.as_mut() {
            m.groups.sort_by_key(|g| g.group);
            m.clients = self.clients.view();
            let quotas = self.quotas.lock().unwrap_or_else(|p| p.into_inner());
            m.quotas = quotas.as_ref().map_or_else(Vec::new, |q| q.views());
        }
        merged
    }

    /// The quotas the client server enforces, for the status.
    pub(in crate::node) fn set_quotas(
        &self,
        quotas: std::sync::Arc<crate::node::client::quota::Quotas>,
    ) {
        *self.quotas.lock().unwrap_or_else(|p| p.into_inner()) = Some(quotas);
    }

    /// Has every loop serve client connections on the port `make` builds
    /// for it (the client server's listener, shared).
    pub(in crate::node) fn serve_clients(
        &self,
        make: impl Fn() -> ClientPort,
    ) -> Result<(), ProposeError> {
        for c in &self.cores {
            c.ports
                .send(PortCommand::Serve(make()))
                .map_err(|_| ProposeError::Stopping)?;
            c.waker.wake();
        }
        Ok(())
    }

    /// Has every loop close its client connections, and waits (a little)
    /// until each has.
    pub(in crate::node) fn stop_clients(&self) {
        for c in &self.cores {
            let (done, closed) = bounded(1);
            if c.ports.send(PortCommand::Stop(done)).is_ok() {
                c.waker.wake();
                let _ = closed.recv_timeout(Duration::from_secs(5));
            }
        }
    }

    /// The counters the client server keeps for this node.
    pub fn client_counters(&self) -> &std::sync::Arc<crate::node::client::stats::ClientCounters> {
        &self.clients
    }

    /// Stops every loop: in-flight flushes finish, then they exit.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        for c in &self.cores {
            let _ = c.send(CoreCommand::Stop);
        }
        for c in &mut self.cores {
            if let Some(t) = c.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for NodeHandle {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

fn open_net_path(
    spec: &NodeSpec,
    plan: &[(Option<usize>, Vec<crate::node::spec::GroupSpec>)],
) -> Result<NetPath, StartError> {
    use crate::net::xdp::{Backend, XdpError, XdpNode};
    if spec.net.backend == Backend::Sockets {
        return Ok(NetPath::Sockets("net.backend = \"sockets\"".into()));
    }
    let why_not = |why: XdpError| match spec.net.backend {
        Backend::Xdp => Err(StartError::Xdp(why)),
        _ => Ok(NetPath::Sockets(format!("AF_XDP unavailable: {why}"))),
    };
    if spec.udp.base_port == 0 {
        // Kernel-chosen ports are known only after binding, per loop.
        return why_not(XdpError::KernelChosenPorts);
    }
    // Loop i's groups arrive on receive queue i.
    let mut routes: Vec<(u16, u32)> = Vec::new();
    for (i, (_, groups)) in plan.iter().enumerate() {
        for g in groups {
            let Some(port) = u16::try_from(u32::from(spec.udp.base_port) + g.group).ok() else {
                return why_not(XdpError::NoPort { group: g.group });
            };
            routes.push((port, i as u32));
        }
    }
    match XdpNode::open(
        &spec.net,
        spec.udp.bind_ip,
        spec.transport.mtu_bytes,
        &routes,
    ) {
        Ok(node) => {
            log_info!(
                "node {}: XDP program ({} instructions) attached to {} ({} XDP)",
                spec.id,
                node.program_insns,
                node.iface.name,
                node.attach_mode
            );
            Ok(NetPath::Xdp(Arc::new(node)))
        }
        Err(why) if spec.net.backend == Backend::Xdp => Err(StartError::Xdp(why)),
        Err(why) => {
            log_info!(
                "node {}: datagrams go through sockets: AF_XDP unavailable: {why}",
                spec.id
            );
            Ok(NetPath::Sockets(format!("AF_XDP unavailable: {why}")))
        }
    }
}
