//! The node's event loop, one per core. See the module documentation of
//! `node` for the turn; everything here runs on the loop's own thread.
//!
//! A node runs one loop per core that owns groups. The *control* loop (the
//! core of the node's first group) also owns the serial ports, the failure
//! detector and the node's heartbeat (`control`); the others (*workers*)
//! hand it what it needs over channels (`node::mesh`: peers heard on their
//! sockets, heartbeats that arrived there, their groups' status) and it
//! hands them the detector's events and the peers' heartbeats, which drive
//! the failover policy of their replicas. Nothing else crosses cores, and
//! no lock is taken. The loop owns the turn, the sockets and the envelope
//! of transport messages; each group's glue is its `replica`.

use crate::consensus::{Message, NodeId, Role};
use crate::net::UdpDriver;
use crate::node::client::conns::{LoopClients, LoopParts, PortCommand};
use crate::node::command::{ClientTicket, CoreCommand, ProposeError, TicketDone};
use crate::node::log::{log_error, log_info, log_warn};
use crate::node::loops::control::Control;
use crate::node::loops::stall::{StallClock, STALL_LOGGED_MS};
use crate::node::loops::waker::Waker;
use crate::node::mesh::{CoreMailbox, CoreMsg, Routing};
use crate::node::replica::Replica;
use crate::node::spec::NodeSpec;
use crate::node::status::{NetView, NodeStatus, StallView, TransportView};
use crate::transport::raft_codec::send_raft_message;
use crate::transport::GroupId;
use crossbeam_channel::Receiver;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Transitions kept for `NodeStatus::transitions`.
const TRANSITIONS_KEPT: usize = 256;
/// Longest wait in poll(2) per turn. Work from other threads, WAL
/// completions, datagrams and serial bytes wake the loop at once (its
/// eventfd and the descriptors are in the poll set); this bounds only what
/// has no descriptor (a serial port being reopened, a line busy sending).
const TURN_MAX: Duration = Duration::from_millis(10);
/// A worker reports a peer heard at most this often.
pub(super) const HEARD_FORWARD_MS: u64 = 10;

/// One core's loop: its replicas, its sockets and (control) the control
/// plane, run by `run` on the loop's own thread.
pub(crate) struct EventLoop {
    pub(super) spec: NodeSpec,
    pub(super) started: Instant,
    /// This loop's index among the node's loops (`routing.cores`).
    pub(super) me: usize,
    pub(super) commands: Receiver<CoreCommand>,
    pub(super) mesh: Receiver<CoreMsg>,
    /// Every loop, and which owns each group: for client requests.
    pub(super) routing: Arc<Routing>,
    /// From the client server: serve clients, or stop.
    pub(super) ports: Receiver<PortCommand>,
    /// The client connections this loop serves, once told to.
    pub(super) clients: Option<LoopClients>,
    /// Scratch: ticketed outcomes gathered at the end of a turn, and
    /// those bound for each other loop.
    pub(super) client_done: Vec<TicketDone>,
    pub(super) client_done_remote: Vec<Vec<TicketDone>>,
    /// This turn's outcomes of ticketed commands (reused, like
    /// `client_done`).
    pub(super) command_done: Vec<crate::node::command::CommandDone>,
    pub(super) udp: UdpDriver,
    pub(super) replicas: Vec<Replica>,
    pub(super) by_group: BTreeMap<GroupId, usize>,
    pub(super) control: Option<Control>,
    pub(super) to_control: Option<CoreMailbox>,
    pub(super) waker: Waker,
    /// Scratch: the descriptors besides the sockets that end a wait.
    pub(super) wake_fds: Vec<std::os::fd::RawFd>,
    /// When each peer was last reported heard to the control loop.
    pub(super) heard_forwarded: BTreeMap<NodeId, u64>,
    pub(super) next_heartbeat_ms: u64,
    pub(super) stalled_noticed: Vec<bool>,
    pub(super) transitions: VecDeque<String>,
    pub(super) out: Vec<Message>,
    pub(super) buf: Vec<u8>,
    /// Raft messages the transport refused (window full): Raft resends.
    pub(super) sends_refused: u64,
    /// The loop's clock, which does not count its own stalls.
    pub(super) clock: StallClock,
    /// When (real ms) a stall was last logged, and stalls not logged since.
    pub(super) stall_logged_real_ms: u64,
    pub(super) stalls_unlogged: u64,
    /// How the datagrams go (AF_XDP's description), or why on sockets.
    pub(super) net_detail: String,
}

/// The node's datagram path, chosen once by its start and shared by its
/// loops. `net.backend = "xdp"` makes an unusable AF_XDP a start error
/// instead of `Sockets`.
#[derive(Clone)]
pub(crate) enum NetPath {
    /// AF_XDP: the node's program; each loop opens its own port.
    Xdp(std::sync::Arc<crate::net::xdp::XdpNode>),
    /// Kernel sockets, and why, for the loops' status (the node's start
    /// logged it once): `net.backend = "sockets"`, or AF_XDP unavailable.
    Sockets(String),
}

impl EventLoop {
    /// Ms since the node started, on the wall clock.
    pub(super) fn real_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The loop's clock: the node's, less the loop's own stalls (see
    /// `stall`). Everything that times a peer or a timer reads this.
    pub(super) fn now_ms(&self) -> u64 {
        self.clock.now(self.real_ms())
    }

    /// The loop's clock without handing the time out: for what only
    /// looks (the wait's length, the status), never for a core.
    pub(super) fn peek_ms(&self) -> u64 {
        self.clock.peek(self.real_ms())
    }

    /// A turn ended at `real_ms`: counts a stall of this loop, and logs
    /// a long one (at most one line a second, with the count of others).
    pub(super) fn note_wake(&mut self, real_ms: u64) {
        let Some(stall_ms) = self.clock.woke(real_ms) else {
            return;
        };
        if stall_ms < STALL_LOGGED_MS {
            return;
        }
        if real_ms < self.stall_logged_real_ms + 1_000 {
            self.stalls_unlogged += 1;
            return;
        }
        self.stall_logged_real_ms = real_ms;
        let others = std::mem::take(&mut self.stalls_unlogged);
        let also = if others > 0 {
            format!(" ({others} more since the last line)")
        } else {
            String::new()
        };
        let line = format!(
            "at {} ms: this loop stalled {stall_ms} ms (paused or starved of CPU); not counted against peers or timers{also}",
            self.now_ms()
        );
        self.note(line);
    }

    /// Runs until told to stop.
    pub(crate) fn run(&mut self) {
        // Opening the logs is not a stall.
        self.clock = StallClock::new(self.real_ms(), self.spec.stall_grace_ms);
        loop {
            // A peek: the time a turn's work took (a blocking disk call
            // under I/O pressure, say) is still this loop's own, to be
            // discounted at the wake, as long as no core was handed it.
            let wait = self.next_deadline_ms().saturating_sub(self.peek_ms());
            let wait = Duration::from_millis(wait).min(TURN_MAX);
            self.clock.waiting(wait.as_millis() as u64);
            self.wake_fds.clear();
            self.wake_fds.push(self.waker.fd());
            if let Some(c) = &self.control {
                self.wake_fds.extend(c.wake_fds());
            }
            if let Some(c) = &self.clients {
                self.wake_fds.push(c.wake_fd());
            }
            self.udp.set_wake_fds(&self.wake_fds);
            if let Err(e) = self.udp.run_once(wait) {
                log_error!("node {}: waiting on the sockets failed: {e}", self.spec.id);
            }
            self.note_wake(self.real_ms());
            // Each read below is a syscall, and the loop turns several
            // times per append at light load: only what the wait found
            // readable is read (level-triggered, so nothing is missed).
            if self.udp.wake_fd_ready(self.waker.fd()) {
                self.waker.drain();
            }
            // Commands are served after the drain and before the drive:
            // one that arrives later wakes the next wait at once, and what
            // these propose goes out in this turn, not after the next
            // wait (up to `TURN_MAX` when nothing else wakes it).
            // One time for the whole turn, read right after the wake.
            let now = self.now_ms();
            if !self.serve_commands(now) {
                self.shutdown();
                return;
            }
            self.serve_ports();
            for n in self.udp.take_notices() {
                log_warn!("node {}: udp: {n}", self.spec.id);
            }
            self.receive_udp(now);
            self.serve_mesh(now);
            self.serve_serial(now);
            for r in &mut self.replicas {
                if r.stopped.is_none() && now >= r.raft.poll_timeout() {
                    r.raft.tick(now);
                }
            }
            self.check_own_disks(now);
            if now >= self.next_heartbeat_ms {
                self.send_heartbeat(now);
                self.next_heartbeat_ms = now + self.spec.detector.keepalive_ms;
            }
            if let Some(c) = self.control.as_mut() {
                c.tick(now);
            }
            self.detector_events(now);
            self.serve_clients(now);
            self.drive_all(now);
            self.route_client_done();
            if let Some(c) = self.clients.as_mut() {
                c.flush(now);
            }
        }
    }

    /// What the client server asks: serve its port, or stop.
    pub(super) fn serve_ports(&mut self) {
        while let Ok(cmd) = self.ports.try_recv() {
            match cmd {
                PortCommand::Serve(port) => {
                    let mail = self.routing.cores[self.me].mail.clone();
                    match LoopClients::new(port, self.me, mail) {
                        Ok(c) => self.clients = Some(c),
                        Err(e) => log_error!(
                            "node {}: this loop cannot serve clients (epoll): {e}",
                            self.spec.id
                        ),
                    }
                }
                PortCommand::Stop(done) => {
                    self.clients = None; // closes every connection
                    let _ = done.send(());
                }
            }
        }
    }

    /// Accepts, reads and serves this loop's client connections.
    pub(super) fn serve_clients(&mut self, now: u64) {
        let Some(mut clients) = self.clients.take() else {
            return;
        };
        let mut parts = LoopParts {
            replicas: &mut self.replicas,
            by_group: &self.by_group,
            routing: &self.routing,
            now_ms: now,
        };
        let ready = self.udp.wake_fd_ready(clients.wake_fd());
        clients.serve(&mut parts, ready);
        self.clients = Some(clients);
    }

    /// Hands each ticketed outcome of this turn to the loop serving its
    /// connection: this one's directly, the others' in one message each.
    pub(super) fn route_client_done(&mut self) {
        let mut done = std::mem::take(&mut self.client_done);
        let mut commands = std::mem::take(&mut self.command_done);
        for r in &mut self.replicas {
            r.take_client_done(&mut done);
            r.take_command_done(&mut commands);
        }
        // Ticketed commands are only this loop's connections' own.
        for d in commands.drain(..) {
            if let Some(c) = self.clients.as_mut() {
                c.deliver_command(d);
            }
        }
        self.command_done = commands;
        for d in done.drain(..) {
            if d.0.core == self.me {
                if let Some(c) = self.clients.as_mut() {
                    c.deliver(d);
                }
            } else if let Some(v) = self.client_done_remote.get_mut(d.0.core) {
                v.push(d);
            }
        }
        self.client_done = done;
        for (core, v) in self.client_done_remote.iter_mut().enumerate() {
            if !v.is_empty() {
                let batch = std::mem::take(v);
                self.routing.cores[core]
                    .mail
                    .send(CoreMsg::ClientDone(batch));
            }
        }
    }

    pub(super) fn next_deadline_ms(&self) -> u64 {
        let mut t = self.next_heartbeat_ms;
        for r in &self.replicas {
            t = t.min(r.raft.poll_timeout());
            if let Some(d) = r.next_tail_deadline() {
                t = t.min(d);
            }
        }
        if let Some(d) = self.control.as_ref().and_then(|c| c.poll_timeout()) {
            t = t.min(d);
        }
        if let Some(d) = self.clients.as_ref().and_then(|c| c.poll_timeout()) {
            t = t.min(d);
        }
        t
    }

    /// Serves queued commands; false once told to stop.
    pub(super) fn serve_commands(&mut self, now: u64) -> bool {
        while let Ok(cmd) = self.commands.try_recv() {
            let group = match &cmd {
                CoreCommand::Status(reply) => {
                    self.udp.refresh_xdp_drops();
                    let _ = reply.send(self.status());
                    continue;
                }
                CoreCommand::Stop => return false,
                CoreCommand::ClientAppends {
                    group,
                    client_id,
                    first_seq,
                    items,
                    ticket,
                } => {
                    self.client_appends(*group, *client_id, *first_seq, items, *ticket);
                    continue;
                }
                CoreCommand::Propose { group, .. }
                | CoreCommand::Append { group, .. }
                | CoreCommand::Membership { group, .. }
                | CoreCommand::Transfer { group, .. }
                | CoreCommand::Read { group, .. }
                | CoreCommand::State { group, .. }
                | CoreCommand::Query { group, .. } => *group,
            };
            let Some(&i) = self.by_group.get(&group) else {
                // The handle sends a group's commands to the core owning it.
                cmd.fail(ProposeError::Internal(format!(
                    "group {group} is not on the core it was sent to"
                )));
                continue;
            };
            let r = &mut self.replicas[i];
            match cmd {
                CoreCommand::Propose { data, reply, .. } => r.propose(data, reply),
                CoreCommand::Append {
                    client_id,
                    seq,
                    data,
                    reply,
                    ..
                } => r.propose_client(client_id, seq, &data, reply),
                CoreCommand::Membership {
                    change,
                    force,
                    reply,
                    ..
                } => r.propose_membership(change, force, reply),
                CoreCommand::Transfer { to, reply, .. } => r.transfer_leadership(to, reply),
                CoreCommand::Read {
                    from,
                    max_entries,
                    max_bytes,
                    wait_ms,
                    stale: true,
                    reply,
                    ..
                } => r.read_or_wait_stale(from, max_entries, max_bytes, wait_ms, now, reply),
                CoreCommand::Read {
                    from,
                    max_entries,
                    max_bytes,
                    wait_ms,
                    stale: false,
                    reply,
                    ..
                } => r.read_log(from, max_entries, max_bytes, wait_ms, reply),
                CoreCommand::State {
                    client_id,
                    seq,
                    command,
                    reply,
                    ..
                } => r.propose_command(
                    client_id,
                    seq,
                    command,
                    crate::node::command::wall_clock_ms(),
                    reply,
                ),
                CoreCommand::Query {
                    query,
                    wait_ms,
                    reply,
                    ..
                } => r.query(query, wait_ms, reply),
                CoreCommand::Status(_) | CoreCommand::Stop | CoreCommand::ClientAppends { .. } => {
                    unreachable!("served above")
                }
            }
        }
        true
    }

    /// Appends another loop's client connection handed over: proposed
    /// with their tickets, whose outcomes go back at the end of the turn.
    pub(super) fn client_appends(
        &mut self,
        group: crate::transport::GroupId,
        client_id: u64,
        first_seq: u64,
        items: &[Vec<u8>],
        ticket: ClientTicket,
    ) {
        match self.by_group.get(&group) {
            Some(&i) => self.replicas[i].propose_client_batch(client_id, first_seq, items, ticket),
            None => {
                let tickets = (0..items.len()).map(|k| ClientTicket {
                    item: ticket.item + k as u32,
                    ..ticket
                });
                let why = ProposeError::Internal(format!(
                    "group {group} is not on the core it was sent to"
                ));
                self.client_done
                    .extend(tickets.map(|t| (t, Err(why.clone()))));
            }
        }
    }

    /// Stops cleanly: what was queued is flushed before the logs close.
    pub(super) fn shutdown(&mut self) {
        for r in &mut self.replicas {
            if r.stopped.is_none() {
                if let Err(e) = r.wal.sync() {
                    log_error!("node {} group {}: final flush: {e}", self.spec.id, r.group);
                }
            }
        }
    }

    /// Logs a line once and keeps it for the status. The log line leaves
    /// out a leading `at N ms: ` (the event's time on the loop's clock,
    /// which for a link going late or dead is when its silence began to
    /// count, so it can be earlier than a line already printed): the log's
    /// own wall-clock stamp orders the lines; the status keeps both.
    pub(super) fn note(&mut self, line: String) {
        let text = line
            .strip_prefix("at ")
            .and_then(|rest| rest.split_once(" ms: "))
            .map_or(line.as_str(), |(_, text)| text);
        let alarming = [
            "-> late",
            "-> dead",
            "-> down",
            "-> ip-partitioned",
            "-> serial-down",
            "stalled",
            "dropped",
        ];
        if alarming.iter().any(|w| text.contains(w)) {
            log_warn!("node {}: {text}", self.spec.id);
        } else {
            log_info!("node {}: {text}", self.spec.id);
        }
        if self.transitions.len() == TRANSITIONS_KEPT {
            self.transitions.pop_front();
        }
        self.transitions.push_back(line);
    }

    /// A leader whose own disk has had writes pending for `disk_stall_ms`
    /// steps down: it can make nothing durable (etcd #13527).
    pub(super) fn check_own_disks(&mut self, now: u64) {
        let stall_ms = self.spec.detector.disk_stall_ms;
        for i in 0..self.replicas.len() {
            let stalled = self.replicas[i].disk_stalled(now, stall_ms);
            if stalled && !self.stalled_noticed[i] {
                let g = self.replicas[i].group;
                self.note(format!("at {now} ms: own disk of group {g} stalled"));
            }
            self.stalled_noticed[i] = stalled;
            let r = &mut self.replicas[i];
            if stalled && r.raft.role() == Role::Leader {
                r.raft.step_down();
                let g = r.group;
                self.note(format!(
                    "at {now} ms: stepped down as leader of group {g}: disk stalled"
                ));
            }
        }
    }

    /// Runs every replica's Ready loop and sends what it produced.
    pub(super) fn drive_all(&mut self, now: u64) {
        for i in 0..self.replicas.len() {
            let mut out = std::mem::take(&mut self.out);
            self.replicas[i].drive(now, &mut out);
            let group = self.replicas[i].group;
            for msg in out.drain(..) {
                // Kept by the transport's history as pieces that share the
                // entries with the log: one copy of them per follower.
                if send_raft_message(self.udp.endpoint_mut(), group, &msg).is_err() {
                    // A full window: Raft's own retries resend it.
                    self.sends_refused += 1;
                }
            }
            self.out = out;
        }
        self.udp.flush();
    }

    /// This loop's part of the node's status (links and peers: control).
    pub(super) fn status(&self) -> NodeStatus {
        let now = self.peek_ms();
        let groups = self.replicas.iter().map(|r| r.view(self.spec.id)).collect();
        let (links, peers) = match &self.control {
            Some(c) => c.views(&self.spec.peers, now),
            None => (Vec::new(), Vec::new()),
        };
        NodeStatus {
            id: self.spec.id,
            uptime_ms: now,
            groups,
            links,
            peers,
            alarm: self.control.as_ref().is_some_and(|c| c.any_link_dead()),
            transitions: self.transitions.iter().cloned().collect(),
            sends_refused: self.sends_refused,
            clients: Default::default(),
            quotas: Vec::new(),
            mac_failures: self.udp.endpoint().stats().mac_failures,
            malformed_dropped: self.udp.endpoint().stats().malformed_dropped,
            stalls: StallView {
                count: self.clock.stalls(),
                stalled_ms: self.clock.stalled_ms(),
                longest_ms: self.clock.longest_ms(),
            },
            net: vec![NetView {
                core_loop: self.me,
                xdp: self.udp.xdp().is_some(),
                detail: match self.udp.xdp_lost() {
                    Some(lost) => lost.to_string(),
                    None => self.net_detail.clone(),
                },
                counters: self.udp.xdp().map(|x| x.1).unwrap_or_default(),
            }],
            transport: self
                .spec
                .peers
                .iter()
                .filter_map(|p| {
                    let endpoint = self.udp.endpoint();
                    let t = endpoint.peer_stats(p.id)?;
                    let retransmits = self
                        .replicas
                        .iter()
                        .filter_map(|r| endpoint.channel_stats(p.id, r.group))
                        .map(|c| c.rexmit_frames)
                        .sum();
                    Some(TransportView {
                        peer: p.id,
                        datagrams_sent: t.datagrams_sent,
                        datagrams_received: t.datagrams_received,
                        nack_rounds: t.nack_rounds,
                        retransmits,
                        rtt_us: t.rtt_us,
                    })
                })
                .collect(),
        }
    }
}
