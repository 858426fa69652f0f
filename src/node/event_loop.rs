//! The node's event loop, one per core. See the module documentation of
//! `node` for the turn; everything here runs on the loop's own thread.
//!
//! A node runs one loop per core that owns groups. The *control* loop (the
//! core of the node's first group) also owns the serial ports, the failure
//! detector and the node's heartbeat (`control`); the others (*workers*)
//! hand it what it needs over channels (`mesh`: peers heard on their
//! sockets, heartbeats that arrived there, their groups' status) and it
//! hands them the detector's events and the peers' heartbeats, which drive
//! the failover policy of their replicas. Nothing else crosses cores, and
//! no lock is taken. The loop owns the turn, the sockets and the envelope
//! of transport messages; each group's glue is its `replica`.

use super::client_conns::{LoopClients, LoopParts, PortCommand};
use super::command::{ClientTicket, CoreCommand, ProposeError, TicketDone};
use super::config::{NodeSpec, SpecError};
use super::control::Control;
use super::errors::StartError;
use super::host::OsHost;
use super::log::{log_error, log_info, log_warn};
use super::mesh::{CoreMailbox, CoreMsg, Routing, Wiring};
use super::replica::Replica;
use super::stall::{StallClock, STALL_LOGGED_MS};
use super::status::{NetView, NodeStatus, StallView, TransportView};
use super::waker::Waker;
use crate::consensus::{Message, NodeId, Role};
use crate::heartbeat::failover::{on_event, on_group_status};
use crate::heartbeat::{Channel, GroupStatus, Heartbeat};
use crate::net::{PeerMap, UdpDriver};
use crate::storage::Wal;
use crate::transport::raft_codec::{
    decode_raft_delivery, send_raft_message, ENVELOPE_HEARTBEAT, ENVELOPE_RAFT,
};
use crate::transport::{Endpoint, Event, GroupId};
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
const HEARD_FORWARD_MS: u64 = 10;

/// One core's loop: its replicas, its sockets and (control) the control
/// plane, run by `run` on the loop's own thread.
pub(crate) struct EventLoop {
    spec: NodeSpec,
    started: Instant,
    /// This loop's index among the node's loops (`routing.cores`).
    me: usize,
    commands: Receiver<CoreCommand>,
    mesh: Receiver<CoreMsg>,
    /// Every loop, and which owns each group: for client requests.
    routing: Arc<Routing>,
    /// From the client server: serve clients, or stop.
    ports: Receiver<PortCommand>,
    /// The client connections this loop serves, once told to.
    clients: Option<LoopClients>,
    /// Scratch: ticketed outcomes gathered at the end of a turn, and
    /// those bound for each other loop.
    client_done: Vec<TicketDone>,
    client_done_remote: Vec<Vec<TicketDone>>,
    /// This turn's outcomes of ticketed commands (reused, like
    /// `client_done`).
    command_done: Vec<super::command::CommandDone>,
    udp: UdpDriver,
    replicas: Vec<Replica>,
    by_group: BTreeMap<GroupId, usize>,
    control: Option<Control>,
    to_control: Option<CoreMailbox>,
    waker: Waker,
    /// Scratch: the descriptors besides the sockets that end a wait.
    wake_fds: Vec<std::os::fd::RawFd>,
    /// When each peer was last reported heard to the control loop.
    heard_forwarded: BTreeMap<NodeId, u64>,
    next_heartbeat_ms: u64,
    stalled_noticed: Vec<bool>,
    transitions: VecDeque<String>,
    out: Vec<Message>,
    buf: Vec<u8>,
    /// Raft messages the transport refused (window full): Raft resends.
    sends_refused: u64,
    /// The loop's clock, which does not count its own stalls.
    clock: StallClock,
    /// When (real ms) a stall was last logged, and stalls not logged since.
    stall_logged_real_ms: u64,
    stalls_unlogged: u64,
    /// How the datagrams go (AF_XDP's description), or why on sockets.
    net_detail: String,
}

/// The node's AF_XDP program, shared by its loops, or why the loops run
/// on sockets: `Err` holds the reason, logged once by the node's start.
/// `net.backend = "xdp"` makes an unusable AF_XDP a start error instead.
pub(crate) type NetPath = Result<std::sync::Arc<crate::net::xdp::XdpNode>, String>;

impl EventLoop {
    /// Opens this loop's logs, binds its sockets and (control) opens the
    /// serial ports. `spec.groups` are this loop's groups; `started` is
    /// the node's clock, shared by its loops.
    #[allow(clippy::too_many_arguments)] // the loop's channels, each its own
    pub(crate) fn open(
        spec: NodeSpec,
        started: Instant,
        me: usize,
        commands: Receiver<CoreCommand>,
        mesh: Receiver<CoreMsg>,
        wiring: Wiring,
        waker: Waker,
        routing: Arc<Routing>,
        ports: Receiver<PortCommand>,
        net: NetPath,
    ) -> Result<Self, StartError> {
        let id = spec.id;
        let now = started.elapsed().as_millis() as u64;
        let udp_cfg = spec.udp_config(&spec.groups);
        let mut peers = PeerMap::new();
        for p in &spec.peers {
            peers.set_node(p.id, p.udp_base);
        }
        let endpoint = Endpoint::new(spec.transport.clone(), spec.key.clone(), id, random_seed()?)
            .map_err(SpecError::Transport)?;
        let (mut udp, report) =
            UdpDriver::bind(udp_cfg, endpoint, peers).map_err(StartError::Udp)?;
        for w in &report.warnings {
            log_warn!("node {id}: {w}");
        }
        let net_detail = match net.and_then(|node| node.port(me as u32)) {
            Ok(port) => {
                let d = port.describe();
                log_info!("node {id} loop {me}: datagrams through {d}");
                udp.attach_xdp(port);
                d
            }
            Err(why) if spec.net.backend == crate::net::xdp::Backend::Xdp => {
                return Err(StartError::Xdp(why));
            }
            // The node's reason was logged once already; a loop's own
            // (no queue for it) is logged here.
            Err(why) if why.starts_with("AF_XDP unavailable") || why.starts_with("net.backend") => {
                why
            }
            Err(why) => {
                log_warn!(
                    "node {id} loop {me}: datagrams go through sockets: AF_XDP unavailable: {why}"
                );
                format!("AF_XDP unavailable: {why}")
            }
        };
        let mut replicas = Vec::new();
        let mut by_group = BTreeMap::new();
        for g in &spec.groups {
            let log_failed = |error| StartError::Log {
                group: g.group,
                dir: g.dir.clone(),
                error,
            };
            let (mut wal, report) = Wal::open(&g.dir, spec.wal.clone()).map_err(log_failed)?;
            wal.notify_completions(waker.fd()).map_err(log_failed)?;
            log_info!("node {id} group {}: {report}", g.group);
            let r = Replica::open(
                &spec,
                g,
                wal,
                report.restored,
                now,
                OsHost::new({
                    let w = waker.clone();
                    Arc::new(move || w.wake())
                })
                .map_err(entropy_failed)?,
            )?;
            by_group.insert(g.group, replicas.len());
            replicas.push(r);
        }
        let (control, to_control) = match wiring {
            Wiring::Control(workers) => {
                let control = Control::open(&spec, now, workers, random_seed()?)?;
                (Some(control), None)
            }
            Wiring::Worker(to_control) => (None, Some(to_control)),
        };
        let groups = replicas.len();
        let cores = routing.cores.len();
        Ok(EventLoop {
            started,
            me,
            commands,
            mesh,
            routing,
            ports,
            clients: None,
            client_done: Vec::new(),
            client_done_remote: vec![Vec::new(); cores],
            command_done: Vec::new(),
            udp,
            replicas,
            by_group,
            control,
            to_control,
            waker,
            wake_fds: Vec::new(),
            heard_forwarded: BTreeMap::new(),
            next_heartbeat_ms: now,
            stalled_noticed: vec![false; groups],
            transitions: VecDeque::new(),
            out: Vec::new(),
            buf: Vec::new(),
            sends_refused: 0,
            clock: StallClock::new(now, spec.stall_grace_ms),
            stall_logged_real_ms: 0,
            stalls_unlogged: 0,
            net_detail,
            spec,
        })
    }

    /// Ms since the node started, on the wall clock.
    fn real_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The loop's clock: the node's, less the loop's own stalls (see
    /// `stall`). Everything that times a peer or a timer reads this.
    fn now_ms(&self) -> u64 {
        self.clock.now(self.real_ms())
    }

    /// The loop's clock without handing the time out: for what only
    /// looks (the wait's length, the status), never for a core.
    fn peek_ms(&self) -> u64 {
        self.clock.peek(self.real_ms())
    }

    /// A turn ended at `real_ms`: counts a stall of this loop, and logs
    /// a long one (at most one line a second, with the count of others).
    fn note_wake(&mut self, real_ms: u64) {
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
    fn serve_ports(&mut self) {
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
    fn serve_clients(&mut self, now: u64) {
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
    fn route_client_done(&mut self) {
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

    fn next_deadline_ms(&self) -> u64 {
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
    fn serve_commands(&mut self, now: u64) -> bool {
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
                    super::command::wall_clock_ms(),
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
    fn client_appends(
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
    fn shutdown(&mut self) {
        for r in &mut self.replicas {
            if r.stopped.is_none() {
                if let Err(e) = r.wal.sync() {
                    log_error!("node {} group {}: final flush: {e}", self.spec.id, r.group);
                }
            }
        }
    }

    /// A peer was heard over UDP on this loop's sockets.
    fn heard_udp(&mut self, now: u64, peer: NodeId) {
        if let Some(c) = self.control.as_mut() {
            c.heard_udp(now, peer);
        } else if let Some(tx) = &self.to_control {
            let last = self.heard_forwarded.entry(peer).or_insert(0);
            if now >= *last + HEARD_FORWARD_MS {
                *last = now;
                tx.send(CoreMsg::HeardUdp { peer });
            }
        }
    }

    fn receive_udp(&mut self, now: u64) {
        while let Some(ev) = self.udp.endpoint_mut().poll_event() {
            let Event::Delivered {
                peer,
                group,
                message,
            } = ev
            else {
                continue;
            };
            self.heard_udp(now, peer);
            if message.first() == Some(&ENVELOPE_RAFT) {
                let (decoded, spare) = decode_raft_delivery(message);
                match decoded {
                    Ok(msg) if msg.from == peer && msg.to == self.spec.id => {
                        if let Some(&i) = self.by_group.get(&group) {
                            self.replicas[i].step(now, msg);
                        }
                    }
                    Ok(_) | Err(_) => self.note(format!("dropped a bad message from node {peer}")),
                }
                // An append's entries keep its buffer; any other message's
                // carries the next reassembled one.
                if let Some(buf) = spare {
                    self.udp.endpoint_mut().recycle_message(buf);
                }
                continue;
            }
            match message.split_first() {
                Some((&ENVELOPE_HEARTBEAT, body)) => match Heartbeat::decode(body) {
                    Ok(hb) if hb.node == peer => self.udp_heartbeat(now, hb),
                    Ok(_) | Err(_) => {
                        self.note(format!("dropped a bad heartbeat from node {peer}"))
                    }
                },
                _ => self.note(format!("dropped an unknown message from node {peer}")),
            }
            // Decoded into owned values above: the buffer can carry the
            // next reassembled message (no allocation and page faults).
            self.udp.endpoint_mut().recycle_message(message);
        }
    }

    /// A heartbeat that arrived over UDP on this loop's sockets.
    fn udp_heartbeat(&mut self, now: u64, hb: Heartbeat) {
        let Some(c) = self.control.as_mut() else {
            if let Some(tx) = &self.to_control {
                tx.send(CoreMsg::Heartbeat(Box::new(hb)));
            }
            return;
        };
        if c.fresh_udp(&hb) {
            self.heartbeat_heard(now, &hb, Channel::Udp);
        }
    }

    /// Messages from the node's other loops.
    fn serve_mesh(&mut self, now: u64) {
        while let Ok(msg) = self.mesh.try_recv() {
            match msg {
                CoreMsg::HeardUdp { peer } => {
                    if let Some(c) = self.control.as_mut() {
                        c.heard_udp(now, peer);
                    }
                }
                CoreMsg::Heartbeat(hb) => self.udp_heartbeat(now, *hb),
                CoreMsg::Groups(groups) => {
                    if let Some(c) = self.control.as_mut() {
                        c.remote_groups(groups);
                    }
                }
                CoreMsg::Detector(ev) => {
                    for r in &mut self.replicas {
                        on_event(&mut r.raft, now, r.group, &ev);
                    }
                }
                CoreMsg::ClientDone(done) => {
                    if let Some(c) = self.clients.as_mut() {
                        for d in done {
                            c.deliver(d);
                        }
                    }
                }
                CoreMsg::ClientAnswer {
                    conn,
                    generation,
                    request,
                    response,
                    small,
                } => {
                    if let Some(c) = self.clients.as_mut() {
                        c.answer(conn, generation, request, response, small);
                    }
                }
                CoreMsg::PeerHeartbeat(hb, ip_alive) => {
                    for g in hb.groups() {
                        if let Some(&i) = self.by_group.get(&g.group) {
                            on_group_status(&mut self.replicas[i].raft, now, &hb, g, ip_alive);
                        }
                    }
                }
            }
        }
    }

    /// Control: the serial lines, and the heartbeats heard on them.
    fn serve_serial(&mut self, now: u64) {
        let Some(c) = self.control.as_mut() else {
            return;
        };
        let udp = &self.udp;
        for hb in c.serve_serial(now, |fd| udp.wake_fd_ready(fd)) {
            self.heartbeat_heard(now, &hb, Channel::Serial);
        }
    }

    /// Control: a fresh, authentic heartbeat from a peer on `channel`.
    fn heartbeat_heard(&mut self, now: u64, hb: &Heartbeat, channel: Channel) {
        let Some(c) = self.control.as_mut() else {
            return;
        };
        let ip_alive = c.heard(now, hb, channel);
        for g in hb.groups() {
            if let Some(&i) = self.by_group.get(&g.group) {
                on_group_status(&mut self.replicas[i].raft, now, hb, g, ip_alive);
            }
        }
        self.detector_events(now);
    }

    /// Control: notes each of the detector's events and hands it to the
    /// failover policy of this loop's replicas (the workers get it from
    /// `Control::next_event`).
    fn detector_events(&mut self, now: u64) {
        while let Some((ev, line)) = self.control.as_mut().and_then(|c| c.next_event()) {
            self.note(line);
            for r in &mut self.replicas {
                on_event(&mut r.raft, now, r.group, &ev);
            }
        }
    }

    /// Logs a line once and keeps it for the status. The log line leaves
    /// out a leading `at N ms: ` (the event's time on the loop's clock,
    /// which for a link going late or dead is when its silence began to
    /// count, so it can be earlier than a line already printed): the log's
    /// own wall-clock stamp orders the lines; the status keeps both.
    fn note(&mut self, line: String) {
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
    fn check_own_disks(&mut self, now: u64) {
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

    fn group_statuses(&self) -> Vec<GroupStatus> {
        self.replicas.iter().map(|r| r.group_status()).collect()
    }

    /// Control: the node's heartbeat on every channel. Worker: its groups
    /// to the control loop, which puts them in the heartbeat.
    fn send_heartbeat(&mut self, now: u64) {
        let mine = self.group_statuses();
        let Some(c) = self.control.as_mut() else {
            if let Some(tx) = &self.to_control {
                tx.send(CoreMsg::Groups(mine));
            }
            return;
        };
        let hb = c.heartbeat(self.spec.id, &self.spec.key, now, mine);
        self.buf.clear();
        self.buf.push(ENVELOPE_HEARTBEAT);
        if hb.encode(&mut self.buf).is_err() {
            return;
        }
        let group = self.replicas[0].group;
        let peers: Vec<NodeId> = self.spec.peers.iter().map(|p| p.id).collect();
        for peer in peers {
            let _ = self.udp.endpoint_mut().send(peer, group, &self.buf);
        }
    }

    /// Runs every replica's Ready loop and sends what it produced.
    fn drive_all(&mut self, now: u64) {
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
    fn status(&self) -> NodeStatus {
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

/// Why a node does not start without the OS's random source: its seeds
/// (session epochs, election jitter) would be guessable.
fn entropy_failed(e: crate::entropy::EntropyError) -> StartError {
    StartError::Os {
        what: "the OS's random source",
        error: e.into(),
    }
}

/// A seed for a session epoch or the detector's jitter, from the OS's
/// random source.
fn random_seed() -> Result<u64, StartError> {
    crate::entropy::random_u64().map_err(entropy_failed)
}
