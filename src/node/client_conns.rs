//! The client connections one event loop serves, on the loop's own
//! thread: no thread per connection, no lock on a session. Every loop
//! polls the node's one listening socket (`EPOLLEXCLUSIVE`: one loop is
//! woken per connection) and serves what it accepts through an epoll set
//! of its own, whose descriptor sits in the loop's `ppoll` beside the UDP
//! sockets. Bytes go through the sans-IO `api::ServerSession`, under a
//! `tls::TlsChannel` when the node serves TLS (rustls driven by hand, on
//! the loop's thread like the rest); what a request asks is
//! `client_dispatch::translate`'s.
//!
//! An append for a group this loop owns is proposed at once with a
//! `ClientTicket` (no callback); one for a group another loop owns goes
//! there as `CoreCommand::ClientAppends`, and its outcome comes back as
//! `CoreMsg::ClientDone`. The rarer calls (reads, tails, ledger and queue
//! commands) go to the owner as ordinary commands whose reply sends a
//! `CoreMsg::ClientAnswer` back; `Leaders` and `Status`, which gather
//! every loop's state, go to the server's one status thread.
//!
//! Answers are gathered per connection and written once per turn (one
//! `write` per connection per turn, more only when the socket is full).
//! Each connection is bounded: at most `requests_in_flight_max` requests
//! unanswered (the session) and `CONN_OUT_BYTES_MAX` bytes of answers
//! unwritten; past either, the loop stops reading it (its client's
//! sends then block in its own kernel), so a client that does not read
//! its answers cannot grow the daemon's memory.

use super::client_admission::ConnId;
use super::client_dispatch::{
    answer_response, appended_response, entries_response, error_response, long_polls_full,
    outcome_response, translate, BatchOutcomes, Dispatch, NodeCall,
};
use super::client_gate::Gate;
use super::command::{ClientTicket, CoreCommand, ProposeError, TicketDone};
use super::mesh::{CoreMailbox, CoreMsg, Routing};
use super::replica::Replica;
use crate::api::{ErrorCode, Incoming, Request, Response, ServerConfig, ServerSession};
use crate::consensus::NodeId;
use crate::node::credentials::{access_of, Credentials};
use crate::node::quota::Quotas;
use crate::tls::{ServerTls, TlsChannel};
use crate::transport::GroupId;
use crossbeam_channel::Sender;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes of answers a connection may have waiting to be written; past
/// this the loop reads no more of its requests until the client reads.
pub(crate) const CONN_OUT_BYTES_MAX: usize = 1 << 20;
/// Requests other than appends whose answers can be large (reads, tails,
/// queries, consumes, status) one connection may have unanswered: up to
/// a frame each, so these bound what a connection that does not read can
/// make the node hold: `CONN_OUT_BYTES_MAX` plus this many answers. The
/// other ledger and queue commands (produce, add, ack, ...) are answered
/// in a few dozen bytes: only `requests_in_flight_max` bounds them, so a
/// pipelining client keeps hundreds in flight, as it does appends.
pub(crate) const CONN_CALLS_IN_FLIGHT_MAX: usize = 8;
/// Bytes read from one connection per turn, so that one busy client
/// cannot starve the loop's other connections and its groups.
const CONN_READ_BYTES_PER_TURN_MAX: usize = 256 << 10;
/// Bytes asked of one read(2) of a connection: read straight into its
/// session's buffer (the loop's `scratch` only takes what a draining
/// connection sends, to be discarded).
const READ_CHUNK_BYTES: usize = 64 << 10;
/// Connections accepted per turn (more wait for the next turn).
const ACCEPTS_PER_TURN_MAX: usize = 64;
/// Readiness events taken from the epoll set per turn.
const EPOLL_EVENTS_MAX: usize = 256;
/// After the Error frame that closes a connection, what the client still
/// sends is read and dropped for this long (and at most
/// `CLOSE_DRAIN_BYTES_MAX`), so that the kernel ends the connection with
/// FIN rather than RST and the client gets to read the Error.
const CLOSE_DRAIN_MS: u64 = 100;
/// See `CLOSE_DRAIN_MS`.
const CLOSE_DRAIN_BYTES_MAX: usize = 1 << 20;
/// The listening socket's token in the epoll set.
const LISTENER_TOKEN: u64 = u64::MAX;

/// What a loop needs to serve clients: the node's listening socket and
/// what every loop shares (the admission gate, the session config, the
/// redirect addresses, the long-poll budget, the status thread).
pub(super) struct ClientPort {
    /// Non-blocking; polled by every loop.
    pub(super) listener: Arc<TcpListener>,
    pub(super) gate: Arc<Gate>,
    pub(super) config: Arc<ServerConfig>,
    /// Client addresses of the nodes, for NotLeader redirects.
    pub(super) addrs: Arc<BTreeMap<NodeId, String>>,
    /// Long polls waiting now, over every loop, and the bound.
    pub(super) tails: Arc<AtomicUsize>,
    pub(super) tails_max: usize,
    /// The status thread (bounded queue).
    pub(super) slow: Sender<SlowCall>,
    /// The node's TLS config, which each accepted connection takes a
    /// session of; `None`: plain TCP (`client.plain = true`).
    pub(super) tls: Option<Arc<ServerTls>>,
    /// Who the connections are and what each may do.
    pub(super) credentials: Arc<Credentials>,
    /// Some principal is limited: requests are checked.
    pub(super) limited: bool,
    /// The principals' write quotas, if some principal has one.
    pub(super) quotas: Option<Arc<Quotas>>,
}

/// What the client server tells a loop.
pub(super) enum PortCommand {
    /// Start serving clients on this port.
    Serve(ClientPort),
    /// Close every connection and the port; say so on the sender.
    Stop(Sender<()>),
}

/// A `Leaders` or `Status` request, for the status thread: it needs every
/// loop's state, which a loop cannot wait for.
pub(super) struct SlowCall {
    /// `Status` (else `Leaders`).
    pub(super) status: bool,
    /// Takes the answer back to the connection's loop.
    pub(super) answer: Box<dyn FnOnce(Response) + Send>,
}

/// One of the node's long-poll slots, held until the poll is answered.
struct TailSlot(Arc<AtomicUsize>);

impl TailSlot {
    /// Takes one of `max`, if any is free.
    fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<TailSlot> {
        let prev = count.fetch_add(1, Ordering::AcqRel);
        if prev >= max {
            count.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(TailSlot(Arc::clone(count)))
    }
}

impl Drop for TailSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Serving requests.
    Open,
    /// Done reading requests (an error, a refusal, the client's EOF):
    /// writes what is queued, then shuts down its sending side.
    Closing,
    /// Sent everything; drops what the client still sends until EOF, the
    /// deadline (node ms) or the byte budget.
    Draining { until_ms: u64, left: usize },
}

/// One client connection.
struct Conn {
    stream: TcpStream,
    /// The TLS session the bytes go through, if the node serves TLS.
    tls: Option<Box<TlsChannel>>,
    session: ServerSession,
    id: ConnId,
    peer: Option<SocketAddr>,
    generation: u32,
    greeted: bool,
    /// Answers not yet written, from `out_at` on.
    out: Vec<u8>,
    out_at: usize,
    /// The `AppendBatch` requests waiting for their items' outcomes.
    batches: HashMap<u64, BatchOutcomes>,
    /// Requests other than appends handed out and not yet answered, whose
    /// answers can be large (`CONN_CALLS_IN_FLIGHT_MAX`).
    calls_in_flight: usize,
    /// The events registered in the epoll set.
    interest: u32,
    phase: Phase,
    /// In the loop's `dirty` list (to pump without readiness).
    dirty: bool,
    /// In the loop's `to_flush` list.
    flushing: bool,
    /// Over its principal's quota: not read from, nor its buffered
    /// requests served, until this time (node ms; in the loop's
    /// `deadlines` too).
    held_until_ms: Option<u64>,
}

impl Conn {
    fn unwritten(&self) -> usize {
        self.out.len() - self.out_at
    }

    /// Whether anything waits to go out: answers, or TLS records
    /// (handshake, data, an alert) its session holds.
    fn wants_write(&self) -> bool {
        self.unwritten() > 0 || self.tls.as_ref().is_some_and(|t| t.wants_write())
    }

    /// Whether the loop must stop reading requests from it for now.
    fn blocked(&self, requests_in_flight_max: usize) -> bool {
        // No room: a whole frame waits (read straight into the session's
        // buffer, only what it can take).
        self.held_until_ms.is_some()
            || self.session.room_bytes() == 0
            || self.unwritten() >= CONN_OUT_BYTES_MAX
            || self.session.in_flight() >= requests_in_flight_max
            || self.calls_in_flight >= CONN_CALLS_IN_FLIGHT_MAX
    }

    /// The answer `resp` to request `id`, queued for this turn's write.
    fn respond(&mut self, id: u64, resp: &Response) {
        self.compact_out();
        self.session.respond_into(id, resp, &mut self.out);
    }

    fn queue(&mut self, bytes: &[u8]) {
        self.compact_out();
        self.out.extend_from_slice(bytes);
    }

    /// Drops the written front of `out` once it is half of it.
    fn compact_out(&mut self) {
        if self.out_at > 0 && self.out_at >= self.out.len() / 2 {
            self.out.drain(..self.out_at);
            self.out_at = 0;
        }
    }

    /// Ticket outcome `r`: a lone append's answer, or one item of a batch
    /// (answered when it is the batch's last).
    fn outcome(&mut self, t: ClientTicket, r: Result<u64, ProposeError>, addrs: &AddrMap) {
        match self.batches.get_mut(&t.request) {
            Some(batch) => {
                if let Some(resp) = batch.add(r, addrs) {
                    self.batches.remove(&t.request);
                    self.respond(t.request, &resp);
                }
            }
            None => self.respond(t.request, &appended_response(r, addrs)),
        }
    }
}

type AddrMap = BTreeMap<NodeId, String>;

/// What serving clients needs of the loop, besides its connections.
pub(super) struct LoopParts<'a> {
    pub(crate) replicas: &'a mut [Replica],
    /// This loop's groups: their index in `replicas`.
    pub(crate) by_group: &'a BTreeMap<GroupId, usize>,
    pub(crate) routing: &'a Routing,
    /// The loop's clock, ms.
    pub(crate) now_ms: u64,
}

/// The client connections of one loop.
pub(super) struct LoopClients {
    port: ClientPort,
    me: usize,
    /// This loop's own mailbox, for the answers of calls it hands out.
    mail: CoreMailbox,
    epoll: OwnedFd,
    conns: Vec<Option<Conn>>,
    free: Vec<u32>,
    next_generation: u32,
    /// Hello and drain deadlines: (node ms, slot, generation); entries
    /// whose connection moved on are skipped when they come up.
    deadlines: BTreeSet<(u64, u32, u32)>,
    /// Connections to pump this turn whatever their readiness (one that
    /// was blocked and is not any more may have requests buffered).
    dirty: Vec<u32>,
    to_flush: Vec<u32>,
    events: Vec<libc::epoll_event>,
    /// Where a closing connection's last bytes are read and dropped.
    scratch: Vec<u8>,
}

impl LoopClients {
    /// Starts serving `port` on loop `me`, whose mailbox is `mail`.
    pub(super) fn new(port: ClientPort, me: usize, mail: CoreMailbox) -> std::io::Result<Self> {
        // SAFETY: epoll_create1 has no memory arguments; checked below.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a new descriptor that nothing else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        let clients = LoopClients {
            port,
            me,
            mail,
            epoll,
            conns: Vec::new(),
            free: Vec::new(),
            next_generation: 1,
            deadlines: BTreeSet::new(),
            dirty: Vec::new(),
            to_flush: Vec::new(),
            events: vec![libc::epoll_event { events: 0, u64: 0 }; EPOLL_EVENTS_MAX],
            scratch: vec![0; READ_CHUNK_BYTES],
        };
        let listener = clients.port.listener.as_raw_fd();
        let events = (libc::EPOLLIN | libc::EPOLLEXCLUSIVE) as u32;
        clients.ctl(libc::EPOLL_CTL_ADD, listener, events, LISTENER_TOKEN)?;
        Ok(clients)
    }

    /// The descriptor that is readable when a connection (or the
    /// listener) has something: for the loop's poll set.
    pub(crate) fn wake_fd(&self) -> std::os::fd::RawFd {
        self.epoll.as_raw_fd()
    }

    /// The next time (node ms) the loop must come back without readiness:
    /// at once while some connection is dirty, else the next deadline.
    pub(crate) fn poll_timeout(&self) -> Option<u64> {
        if !self.dirty.is_empty() {
            return Some(0);
        }
        self.deadlines.first().map(|d| d.0)
    }

    fn ctl(&self, op: libc::c_int, fd: i32, events: u32, token: u64) -> std::io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` is a live epoll_event; the descriptors are ours.
        let r = unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// One turn: accepts, reads and serves what is ready (`ready`: the
    /// loop's wait found the epoll descriptor readable), lets go of
    /// connections past their deadlines. Answers are written by `flush`.
    pub(crate) fn serve(&mut self, parts: &mut LoopParts<'_>, ready: bool) {
        // The epoll descriptor is readable while events wait: when the
        // loop's wait did not find it so, there is nothing to collect
        // (the syscall saved is one per turn).
        let n = if ready {
            // SAFETY: `events` is a live buffer of EPOLL_EVENTS_MAX entries.
            unsafe {
                libc::epoll_wait(
                    self.epoll.as_raw_fd(),
                    self.events.as_mut_ptr(),
                    EPOLL_EVENTS_MAX as i32,
                    0,
                )
            }
        } else {
            0
        };
        for i in 0..n.max(0) as usize {
            let ev = self.events[i];
            let token = ev.u64;
            if token == LISTENER_TOKEN {
                self.accept(parts.now_ms);
                continue;
            }
            let (slot, generation) = ((token >> 32) as u32, token as u32);
            let Some(c) = self.live(slot, generation) else {
                continue;
            };
            if ev.events & libc::EPOLLOUT as u32 != 0 && !c.flushing {
                c.flushing = true;
                self.to_flush.push(slot);
            }
            if ev.events & (libc::EPOLLIN | libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                self.mark_dirty(slot);
            }
        }
        self.expire(parts.now_ms);
        let dirty = std::mem::take(&mut self.dirty);
        for &slot in &dirty {
            if let Some(Some(c)) = self.conns.get_mut(slot as usize) {
                c.dirty = false;
            }
        }
        for &slot in &dirty {
            self.pump(slot, parts);
        }
        let mut dirty = dirty;
        dirty.clear();
        if self.dirty.is_empty() {
            self.dirty = dirty;
        }
    }

    /// The connection in `slot` if it is still the one of `generation`.
    fn live(&mut self, slot: u32, generation: u32) -> Option<&mut Conn> {
        self.conns
            .get_mut(slot as usize)?
            .as_mut()
            .filter(|c| c.generation == generation)
    }

    fn mark_dirty(&mut self, slot: u32) {
        if let Some(Some(c)) = self.conns.get_mut(slot as usize) {
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(slot);
            }
        }
    }

    fn mark_flush(&mut self, slot: u32) {
        if let Some(Some(c)) = self.conns.get_mut(slot as usize) {
            if !c.flushing {
                c.flushing = true;
                self.to_flush.push(slot);
            }
        }
    }

    fn accept(&mut self, now_ms: u64) {
        for _ in 0..ACCEPTS_PER_TURN_MAX {
            let stream = match self.port.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                // WouldBlock (another loop took it), or a connection that
                // failed before it was accepted.
                Err(_) => return,
            };
            let Some(id) = self.port.gate.admit(&stream) else {
                continue; // refused: dropping it closes it
            };
            if stream.set_nonblocking(true).is_err() {
                self.port.gate.closed(id);
                continue;
            }
            let _ = stream.set_nodelay(true);
            let peer = stream.peer_addr().ok();
            let tls = match self.port.tls.as_ref().map(|t| t.accept()) {
                None => None,
                Some(Ok(conn)) => Some(Box::new(TlsChannel::new(conn))),
                Some(Err(e)) => {
                    self.port.gate.tls_failed(peer, &e);
                    self.port.gate.closed(id);
                    continue;
                }
            };
            let slot = match self.free.pop() {
                Some(s) => s,
                None => {
                    self.conns.push(None);
                    (self.conns.len() - 1) as u32
                }
            };
            let generation = self.next_generation;
            self.next_generation = self.next_generation.wrapping_add(1).max(1);
            let token = (u64::from(slot) << 32) | u64::from(generation);
            let interest = libc::EPOLLIN as u32;
            if self
                .ctl(libc::EPOLL_CTL_ADD, stream.as_raw_fd(), interest, token)
                .is_err()
            {
                self.free.push(slot);
                self.port.gate.closed(id);
                continue;
            }
            let left = self.port.gate.hello_time_left(id).unwrap_or_default();
            // Rounded up: the gate's own clock decides, and must have
            // passed the deadline when this timer fires (`expire`).
            let deadline = now_ms + left.as_millis() as u64 + 1;
            self.deadlines.insert((deadline, slot, generation));
            self.conns[slot as usize] = Some(Conn {
                stream,
                tls,
                session: ServerSession::new(Arc::clone(&self.port.config)),
                id,
                peer,
                generation,
                greeted: false,
                out: Vec::new(),
                out_at: 0,
                batches: HashMap::new(),
                calls_in_flight: 0,
                interest,
                phase: Phase::Open,
                dirty: false,
                flushing: false,
                held_until_ms: None,
            });
        }
    }

    /// Connections past their Hello or drain deadline.
    fn expire(&mut self, now_ms: u64) {
        while let Some(&(at, slot, generation)) = self.deadlines.first() {
            if at > now_ms {
                break;
            }
            self.deadlines.pop_first();
            let gate = Arc::clone(&self.port.gate);
            let Some(c) = self.live(slot, generation) else {
                continue;
            };
            match c.phase {
                Phase::Open if !c.greeted => {
                    // The policy's clock is the gate's: if by it the
                    // deadline is still ahead, wait for it (a connection
                    // let go here must be counted as a timeout there).
                    if let Some(left) = gate.hello_time_left(c.id).filter(|l| !l.is_zero()) {
                        let again = now_ms + left.as_millis() as u64 + 1;
                        self.deadlines.insert((again, slot, generation));
                        continue;
                    }
                    gate.hello_expired(c.id, c.peer);
                    let why = Response::Error {
                        code: ErrorCode::Timeout,
                        message: format!("no Hello within {} ms", gate.hello_timeout_ms),
                        leader: None,
                    };
                    c.respond(0, &why);
                    c.phase = Phase::Closing;
                    self.mark_flush(slot);
                    self.mark_dirty(slot);
                }
                Phase::Draining { .. } => self.close(slot),
                Phase::Open if c.held_until_ms.is_some_and(|t| t <= at) => {
                    // Its quota allows again: serve what it sent, read on.
                    c.held_until_ms = None;
                    self.mark_dirty(slot);
                }
                _ => {}
            }
        }
    }

    /// Reads and serves connection `slot` as far as its bounds allow,
    /// then sets what it waits for.
    fn pump(&mut self, slot: u32, parts: &mut LoopParts<'_>) {
        let in_flight_max = self.port.config.requests_in_flight_max;
        let mut budget = CONN_READ_BYTES_PER_TURN_MAX;
        while let Some(Some(c)) = self.conns.get_mut(slot as usize) {
            if let Phase::Draining { until_ms, left } = c.phase {
                match c.stream.read(&mut self.scratch) {
                    Ok(n) if n > 0 && n < left => {
                        c.phase = Phase::Draining {
                            until_ms,
                            left: left - n,
                        };
                        continue;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    _ => {
                        self.close(slot);
                        break;
                    }
                }
            }
            if c.phase != Phase::Open {
                break;
            }
            if self.serve_frames(slot, parts) {
                self.mark_flush(slot);
                break;
            }
            let Some(Some(c)) = self.conns.get_mut(slot as usize) else {
                break;
            };
            if c.blocked(in_flight_max) {
                break;
            }
            if budget == 0 {
                self.mark_dirty(slot);
                break;
            }
            let want = READ_CHUNK_BYTES.min(budget);
            let (got, tls_out) = match &mut c.tls {
                None => (c.session.read_from(c.stream.as_fd(), want), false),
                Some(tls) => {
                    // At most the session's room, so it takes all of it
                    // (the rest stays decrypted, or not yet, in rustls).
                    let room = c.session.room_bytes().min(want);
                    let got = tls.read(&mut c.stream, &mut self.scratch[..room]);
                    if let Ok(n) = got {
                        let took = c.session.push(&self.scratch[..n]);
                        debug_assert_eq!(took, n);
                    }
                    // A handshake step, a key update or an alert to send.
                    (got, tls.wants_write())
                }
            };
            if tls_out {
                self.mark_flush(slot);
            }
            let Some(Some(c)) = self.conns.get_mut(slot as usize) else {
                break;
            };
            match got {
                Ok(0) => {
                    // The client is done sending: answer what is queued
                    // and close.
                    c.phase = Phase::Closing;
                    self.mark_flush(slot);
                    break;
                }
                Ok(n) => budget -= n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    if let Some(tls) = c
                        .tls
                        .as_mut()
                        .filter(|_| e.kind() == ErrorKind::InvalidData)
                    {
                        // The handshake failed or a record was corrupt:
                        // tell the peer why (its alert), once, then close.
                        self.port.gate.tls_failed(c.peer, &e);
                        let _ = tls.send(&mut c.stream);
                    }
                    self.close(slot);
                    break;
                }
            }
        }
        self.rearm(slot);
    }

    /// Serves the session's complete requests one at a time while the
    /// connection's bounds allow (the rest wait in the session), answering
    /// the Hello; true if the connection failed (its Error is queued).
    fn serve_frames(&mut self, slot: u32, parts: &mut LoopParts<'_>) -> bool {
        let in_flight_max = self.port.config.requests_in_flight_max;
        loop {
            let Some(Some(c)) = self.conns.get_mut(slot as usize) else {
                return true;
            };
            if c.held_until_ms.is_some()
                || c.session.in_flight() >= in_flight_max
                || c.unwritten() >= CONN_OUT_BYTES_MAX
                || c.calls_in_flight >= CONN_CALLS_IN_FLIGHT_MAX
            {
                return false;
            }
            let generation = c.generation;
            if self.over_quota(slot, parts.now_ms) {
                return false;
            }
            let Some(Some(c)) = self.conns.get_mut(slot as usize) else {
                return true;
            };
            if !c.session.is_authenticated() && c.session.principal().is_none() {
                // A client certificate that names a principal makes the
                // connection that principal, token or not.
                let cn = c
                    .tls
                    .as_ref()
                    .and_then(|t| t.peer_certificates()?.first())
                    .and_then(|leaf| crate::tls::subject::common_name(leaf));
                if let Some(p) = cn.and_then(|cn| self.port.credentials.by_certificate(&cn)) {
                    c.session.certified(p);
                }
            }
            match c.session.poll() {
                Ok(Some(Incoming::Handshake { id: hello, reply })) => {
                    if self.port.gate.authenticate(c.id, c.peer) {
                        c.greeted = true;
                        c.queue(&reply);
                        continue;
                    }
                    let why = Response::Error {
                        code: ErrorCode::Unavailable,
                        message: "too many client connections; retry later".into(),
                        leader: None,
                    };
                    c.respond(hello, &why);
                    c.phase = Phase::Closing;
                    return true;
                }
                Ok(Some(Incoming::Request { id, req })) => {
                    self.dispatch(slot, generation, id, req, parts)
                }
                Ok(None) => return false,
                Err(e) => {
                    if e == crate::api::ProtocolError::BadToken {
                        self.port.gate.bad_token(c.peer);
                    }
                    if let Some(frame) = c.session.close_frame() {
                        c.queue(&frame);
                    }
                    c.phase = Phase::Closing;
                    return true;
                }
            }
        }
    }

    /// Sets the epoll interest of `slot` from its state.
    fn rearm(&mut self, slot: u32) {
        let in_flight_max = self.port.config.requests_in_flight_max;
        let Some(Some(c)) = self.conns.get(slot as usize) else {
            return;
        };
        let read = match c.phase {
            Phase::Open => !c.blocked(in_flight_max),
            Phase::Closing => false,
            Phase::Draining { .. } => true,
        };
        let mut want = 0u32;
        if read {
            want |= libc::EPOLLIN as u32;
        }
        if c.wants_write() && !c.flushing {
            want |= libc::EPOLLOUT as u32;
        }
        if want != c.interest {
            let token = (u64::from(slot) << 32) | u64::from(c.generation);
            let fd = c.stream.as_raw_fd();
            if self.ctl(libc::EPOLL_CTL_MOD, fd, want, token).is_ok() {
                if let Some(Some(c)) = self.conns.get_mut(slot as usize) {
                    c.interest = want;
                }
            }
        }
    }

    /// Request `id` of connection `slot`: carried out here, handed to the
    /// loop owning its group, or answered at once.
    fn dispatch(
        &mut self,
        slot: u32,
        generation: u32,
        id: u64,
        req: Request,
        parts: &mut LoopParts<'_>,
    ) {
        if let Some(why) = self.denied(slot, generation, &req) {
            if let Some(c) = self.live(slot, generation) {
                c.respond(id, &why);
            }
            self.mark_flush(slot);
            return;
        }
        self.charge(slot, generation, &req, parts.now_ms);
        let routing = parts.routing;
        let call = match translate(req, |g| routing.owner.contains_key(&g)) {
            Dispatch::Call(call) => call,
            Dispatch::Answer(resp) => {
                if let Some(c) = self.live(slot, generation) {
                    c.respond(id, &resp);
                }
                self.mark_flush(slot);
                return;
            }
            Dispatch::Nothing => return,
        };
        let ticket = ClientTicket {
            core: self.me,
            conn: slot,
            generation,
            request: id,
            item: 0,
        };
        match call {
            NodeCall::Append {
                group,
                client_id,
                seq,
                data,
            } => match parts.by_group.get(&group) {
                // This loop's group: proposed from the request's own
                // buffer, nothing gathered.
                Some(&i) => parts.replicas[i].propose_client_ticket(client_id, seq, &data, ticket),
                None => self.append(group, client_id, seq, &[data], ticket, parts),
            },
            NodeCall::AppendBatch {
                group,
                client_id,
                first_seq,
                items,
            } => {
                if let Some(c) = self.live(slot, generation) {
                    c.batches.insert(id, BatchOutcomes::new(items.len()));
                }
                self.append(group, client_id, first_seq, &items, ticket, parts);
            }
            NodeCall::Leaders | NodeCall::Status => {
                if let Some(c) = self.live(slot, generation) {
                    c.calls_in_flight += 1;
                }
                let status = matches!(call, NodeCall::Status);
                let answer = self.answer_back(slot, generation, id, false);
                let sent = self.port.slow.try_send(SlowCall {
                    status,
                    answer: Box::new(answer),
                });
                if sent.is_err() {
                    let busy = ProposeError::Busy("too many status requests waiting".into());
                    let resp = error_response(busy, &self.port.addrs);
                    self.answer(slot, generation, id, resp, false);
                }
            }
            // A command to this loop's group: proposed at once, so the
            // group's commands keep the order they came in on the
            // connection. One whose answer is small goes by ticket, as
            // appends do (no mail, no wake-up); a consume's answer carries
            // messages to read from the log, so it comes back by mail.
            NodeCall::State {
                group,
                client_id,
                seq,
                command,
                encoded,
            } if parts.by_group.contains_key(&group) => {
                let i = parts.by_group[&group];
                let now_ms = super::command::wall_clock_ms();
                if matches!(command, crate::state::Command::Consume { .. }) {
                    if let Some(c) = self.live(slot, generation) {
                        c.calls_in_flight += 1;
                    }
                    let back = self.answer_back(slot, generation, id, false);
                    let addrs = Arc::clone(&self.port.addrs);
                    let reply = Box::new(move |r| back(outcome_response(r, &addrs)));
                    parts.replicas[i].propose_command(client_id, seq, command, now_ms, reply);
                } else {
                    let call = (client_id, seq, command, encoded);
                    parts.replicas[i].propose_command_ticket(call, now_ms, ticket);
                }
            }
            call => self.call_owner(slot, generation, id, call, parts),
        }
    }

    /// A closure that takes an answer to request `id` of `slot` back to
    /// this loop (from whichever thread answers it).
    /// `small`: the answer is a small one (not counted in
    /// `calls_in_flight`).
    fn answer_back(
        &self,
        slot: u32,
        generation: u32,
        id: u64,
        small: bool,
    ) -> impl FnOnce(Response) + Send {
        let mail = self.mail.clone();
        move |response| {
            mail.send(CoreMsg::ClientAnswer {
                conn: slot,
                generation,
                request: id,
                response,
                small,
            })
        }
    }

    /// Appends `items` as client `client_id`'s `first_seq..`: proposed
    /// here if this loop owns `group` (copied once, into the entry), else
    /// copied out of the frame and handed to its owner, so that no frame
    /// outlives its dispatch and pins the connection's read buffer.
    fn append(
        &mut self,
        group: GroupId,
        client_id: u64,
        first_seq: u64,
        items: &[bytes::Bytes],
        ticket: ClientTicket,
        parts: &mut LoopParts<'_>,
    ) {
        if let Some(&i) = parts.by_group.get(&group) {
            parts.replicas[i].propose_client_batch(client_id, first_seq, items, ticket);
            return;
        }
        let Some(&owner) = parts.routing.owner.get(&group) else {
            return; // translate answered an unknown group already
        };
        let count = items.len();
        let cmd = CoreCommand::ClientAppends {
            group,
            client_id,
            first_seq,
            items: items.iter().map(|item| item.to_vec()).collect(),
            ticket,
        };
        if parts.routing.cores[owner].try_command(cmd).is_err() {
            let why = ProposeError::Busy(format!(
                "the queue of the core serving group {group} is full"
            ));
            let addrs = Arc::clone(&self.port.addrs);
            if let Some(c) = self.live(ticket.conn, ticket.generation) {
                for k in 0..count {
                    let t = ClientTicket {
                        item: k as u32,
                        ..ticket
                    };
                    c.outcome(t, Err(why.clone()), &addrs);
                }
            }
            self.mark_flush(ticket.conn);
        }
    }

    /// A read, a tail, a ledger or queue command: to the loop owning its
    /// group (this one too) as a command whose reply comes back here.
    fn call_owner(
        &mut self,
        slot: u32,
        generation: u32,
        id: u64,
        call: NodeCall,
        parts: &mut LoopParts<'_>,
    ) {
        let addrs = Arc::clone(&self.port.addrs);
        let small = call.answer_is_small();
        if let Some(c) = self.live(slot, generation) {
            if !small {
                c.calls_in_flight += 1;
            }
        }
        // A long poll waits on the group's loop; it holds one of the
        // node's long-poll slots until it is answered.
        let tail_slot = if !call.long_poll() {
            None
        } else if let Some(s) = TailSlot::take(&self.port.tails, self.port.tails_max) {
            Some(s)
        } else {
            self.answer(slot, generation, id, long_polls_full(&addrs), false);
            return;
        };
        let back = self.answer_back(slot, generation, id, small);
        let done = move |resp: Response| {
            drop(tail_slot);
            back(resp);
        };
        let (group, cmd) = match call {
            NodeCall::Read {
                group,
                from,
                max_entries,
                max_bytes,
                wait_ms,
                stale,
                tail: _,
            } => (
                group,
                CoreCommand::Read {
                    group,
                    from,
                    max_entries,
                    max_bytes,
                    wait_ms,
                    stale,
                    reply: Box::new(move |r| done(entries_response(r, &addrs))),
                },
            ),
            NodeCall::State {
                group,
                client_id,
                seq,
                command,
                ..
            } => (
                group,
                CoreCommand::State {
                    group,
                    client_id,
                    seq,
                    command,
                    reply: Box::new(move |r| done(outcome_response(r, &addrs))),
                },
            ),
            NodeCall::Query {
                group,
                query,
                wait_ms,
            } => (
                group,
                CoreCommand::Query {
                    group,
                    query,
                    wait_ms,
                    reply: Box::new(move |r| done(answer_response(r, &addrs))),
                },
            ),
            NodeCall::Append { .. }
            | NodeCall::AppendBatch { .. }
            | NodeCall::Leaders
            | NodeCall::Status => unreachable!("served by dispatch"),
        };
        let Some(&owner) = parts.routing.owner.get(&group) else {
            cmd.fail(ProposeError::UnknownGroup(group));
            return;
        };
        if let Err(cmd) = parts.routing.cores[owner].try_command(cmd) {
            cmd.fail(ProposeError::Busy(format!(
                "the queue of the core serving group {group} is full"
            )));
        }
    }

    /// The Forbidden answer to `req` if the connection's principal may
    /// not make it (counted and logged); `None` if it may. A node whose
    /// principals all have every permission checks nothing.
    fn denied(&self, slot: u32, generation: u32, req: &Request) -> Option<Response> {
        if !self.port.limited {
            return None;
        }
        let c = self.conns.get(slot as usize)?.as_ref()?;
        if c.generation != generation {
            return None;
        }
        let principal = self.port.credentials.principal(c.session.principal()?)?;
        if principal.all {
            return None;
        }
        let access = access_of(req)?;
        if principal.allows(&access) {
            return None;
        }
        let why = principal.denial(&access);
        self.port.gate.denied(c.peer, &principal.name, &why);
        Some(Response::Error {
            code: ErrorCode::Forbidden,
            message: why,
            leader: None,
        })
    }

    /// Charges `req` to the quota of the connection's principal. The
    /// request itself is served: a quota delays the next ones
    /// (`over_quota`), it never refuses.
    fn charge(&mut self, slot: u32, generation: u32, req: &Request, now_ms: u64) {
        // Fields borrowed apart: no reference count touched per request
        // (the Arcs are shared by every loop's core).
        let Some(quotas) = &self.port.quotas else {
            return;
        };
        let Some(Some(c)) = self.conns.get_mut(slot as usize) else {
            return;
        };
        if c.generation != generation {
            return;
        }
        let Some(principal) = c.session.principal() else {
            return;
        };
        quotas.charge(principal, req, now_ms.saturating_mul(1_000_000));
    }

    /// Holds connection `slot` if it has requests to serve and its
    /// principal is over its quota: true if it is held now.
    fn over_quota(&mut self, slot: u32, now_ms: u64) -> bool {
        let Some(quotas) = &self.port.quotas else {
            return false;
        };
        let Some(Some(c)) = self.conns.get_mut(slot as usize) else {
            return false;
        };
        let Some(principal) = c
            .session
            .principal()
            .filter(|_| c.session.is_authenticated())
        else {
            return false;
        };
        if c.session.buffered_bytes() == 0 {
            return false;
        }
        let Some(until_ns) = quotas.hold(principal, now_ms.saturating_mul(1_000_000)) else {
            return false;
        };
        let until_ms = until_ns.div_ceil(1_000_000);
        c.held_until_ms = Some(until_ms);
        self.deadlines.insert((until_ms, slot, c.generation));
        true
    }

    /// The outcome of a ticketed command of this loop's connections.
    pub(crate) fn deliver_command(&mut self, (t, o): super::command::CommandDone) {
        let live = self.conns.get_mut(t.conn as usize).and_then(Option::as_mut);
        let Some(c) = live.filter(|c| c.generation == t.generation) else {
            return; // the connection has gone
        };
        c.respond(t.request, &outcome_response(Ok(o), &self.port.addrs));
        self.after_answer(t.conn);
    }

    /// The outcome of a ticketed append of this loop's connections.
    pub(crate) fn deliver(&mut self, (t, r): TicketDone) {
        let live = self.conns.get_mut(t.conn as usize).and_then(Option::as_mut);
        let Some(c) = live.filter(|c| c.generation == t.generation) else {
            return; // the connection has gone
        };
        c.outcome(t, r, &self.port.addrs);
        self.after_answer(t.conn);
    }

    /// The answer to a request that was not an append (`small`: one not
    /// counted in `calls_in_flight`).
    pub(crate) fn answer(
        &mut self,
        conn: u32,
        generation: u32,
        request: u64,
        resp: Response,
        small: bool,
    ) {
        let Some(c) = self.live(conn, generation) else {
            return;
        };
        if !small {
            c.calls_in_flight = c.calls_in_flight.saturating_sub(1);
        }
        c.respond(request, &resp);
        self.after_answer(conn);
    }

    /// A request of `slot` was answered: its answer goes out this turn,
    /// and a connection that waited for room is read again.
    fn after_answer(&mut self, slot: u32) {
        self.mark_flush(slot);
        if let Some(Some(c)) = self.conns.get(slot as usize) {
            if c.phase == Phase::Open && c.interest & libc::EPOLLIN as u32 == 0 {
                self.mark_dirty(slot);
            }
        }
    }

    /// Writes each connection's queued answers: one write per connection
    /// per turn (the rest when the socket has room again).
    pub(crate) fn flush(&mut self, now_ms: u64) {
        let to_flush = std::mem::take(&mut self.to_flush);
        for &slot in &to_flush {
            let Some(Some(c)) = self.conns.get_mut(slot as usize) else {
                continue;
            };
            c.flushing = false;
            if c.unwritten() == 0 && c.phase == Phase::Closing {
                if let Some(tls) = &mut c.tls {
                    tls.close(); // once: rustls sends one close_notify
                }
            }
            let unwritten = c.unwritten();
            let written = match &mut c.tls {
                None if unwritten > 0 => c.stream.write(&c.out[c.out_at..]).map(|n| c.out_at += n),
                None => Ok(()),
                Some(tls) => tls.write_from(&mut c.stream, &c.out, &mut c.out_at),
            };
            match written {
                Ok(()) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                Err(_) => {
                    self.close(slot);
                    continue;
                }
            }
            if c.unwritten() == 0 {
                c.out.clear();
                c.out_at = 0;
            }
            if !c.wants_write() && c.phase == Phase::Closing {
                let _ = c.stream.shutdown(Shutdown::Write);
                c.phase = Phase::Draining {
                    until_ms: now_ms + CLOSE_DRAIN_MS,
                    left: CLOSE_DRAIN_BYTES_MAX,
                };
                self.deadlines
                    .insert((now_ms + CLOSE_DRAIN_MS, slot, c.generation));
                self.mark_dirty(slot);
            } else if c.phase == Phase::Open && c.unwritten() < CONN_OUT_BYTES_MAX {
                // Room again: requests it held back may be read.
                if c.interest & libc::EPOLLIN as u32 == 0 {
                    self.mark_dirty(slot);
                }
            }
            self.rearm(slot);
        }
        let mut to_flush = to_flush;
        to_flush.clear();
        if self.to_flush.is_empty() {
            self.to_flush = to_flush;
        }
    }

    /// Lets connection `slot` go.
    fn close(&mut self, slot: u32) {
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::take) else {
            return;
        };
        // The gate may hold a clone of the socket (before the Hello),
        // which would keep it in the epoll set: take it out first.
        let _ = self.ctl(libc::EPOLL_CTL_DEL, c.stream.as_raw_fd(), 0, 0);
        self.port.gate.closed(c.id);
        self.free.push(slot);
    }

    /// Closes every connection (the server is stopping).
    pub(crate) fn close_all(&mut self) {
        let _ = self.ctl(
            libc::EPOLL_CTL_DEL,
            self.port.listener.as_raw_fd(),
            0,
            LISTENER_TOKEN,
        );
        for slot in 0..self.conns.len() as u32 {
            if let Some(Some(c)) = self.conns.get(slot as usize) {
                let _ = c.stream.shutdown(Shutdown::Both);
            }
            self.close(slot);
        }
    }
}

impl Drop for LoopClients {
    fn drop(&mut self) {
        self.close_all();
    }
}
