//! The client connections one event loop serves, on the loop's own
//! thread: no thread per connection, no lock on a session. Every loop
//! polls the node's one listening socket (`EPOLLEXCLUSIVE`: one loop is
//! woken per connection) and serves what it accepts through an epoll set
//! of its own, whose descriptor sits in the loop's `ppoll` beside the UDP
//! sockets. Bytes go through the sans-IO `api::ServerSession`, under a
//! `tls::TlsChannel` when the node serves TLS (rustls driven by hand, on
//! the loop's thread like the rest); what a request asks is
//! `dispatch::translate`'s.
//!
//! This file owns the turn over the connections: readiness, reading,
//! serving frames, writing answers. Where a request goes is `routing`'s,
//! what its principal may do `access`'s, a connection accepted, expired
//! or closed `lifecycle`'s, one connection's buffers and bounds `conn`'s.
//! Nothing here blocks: every socket is non-blocking and every read and
//! accept bounded per turn.
//!
//! Answers are gathered per connection and written once per turn (one
//! `write` per connection per turn, more only when the socket is full).
//! Each connection is bounded: at most `requests_in_flight_max` requests
//! unanswered (the session) and `CONN_OUT_BYTES_MAX` bytes of answers
//! unwritten; past either, the loop stops reading it (its client's
//! sends then block in its own kernel), so a client that does not read
//! its answers cannot grow the daemon's memory.

use crate::api::{ErrorCode, Incoming, Response, ServerConfig};
use crate::consensus::NodeId;
use crate::node::client::credentials::Credentials;
use crate::node::client::dispatch::outcome_response;
use crate::node::client::gate::Gate;
use crate::node::client::quota::Quotas;
use crate::node::command::TicketDone;
use crate::node::mesh::{CoreMailbox, Routing};
use crate::node::replica::Replica;
use crate::tls::ServerTls;
use crate::transport::GroupId;
use crossbeam_channel::Sender;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::conn::{Conn, Phase, CONN_CALLS_IN_FLIGHT_MAX, CONN_OUT_BYTES_MAX};

/// Bytes read from one connection per turn, so that one busy client
/// cannot starve the loop's other connections and its groups.
const CONN_READ_BYTES_PER_TURN_MAX: usize = 256 << 10;
/// Bytes asked of one read(2) of a connection: read straight into its
/// session's buffer (the loop's `scratch` only takes what a draining
/// connection sends, to be discarded).
const READ_CHUNK_BYTES: usize = 64 << 10;
/// Connections accepted per turn (more wait for the next turn).
pub(super) const ACCEPTS_PER_TURN_MAX: usize = 64;
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
pub(super) const LISTENER_TOKEN: u64 = u64::MAX;

/// What `LoopClients::ctl` does to a descriptor in the epoll set.
pub(super) enum Ctl {
    Add,
    Mod,
    Del,
}

/// What a loop needs to serve clients: the node's listening socket and
/// what every loop shares (the admission gate, the session config, the
/// redirect addresses, the long-poll budget, the status thread).
pub(in crate::node) struct ClientPort {
    /// Non-blocking; polled by every loop.
    pub(in crate::node) listener: Arc<TcpListener>,
    pub(in crate::node) gate: Arc<Gate>,
    pub(in crate::node) config: Arc<ServerConfig>,
    /// Client addresses of the nodes, for NotLeader redirects.
    pub(in crate::node) addrs: Arc<BTreeMap<NodeId, String>>,
    /// Long polls waiting now, over every loop, and the bound.
    pub(in crate::node) tails: Arc<AtomicUsize>,
    pub(in crate::node) tails_max: usize,
    /// The status thread (bounded queue).
    pub(in crate::node) slow: Sender<SlowCall>,
    /// The node's TLS config, which each accepted connection takes a
    /// session of; `None`: plain TCP (`client.plain = true`).
    pub(in crate::node) tls: Option<Arc<ServerTls>>,
    /// Who the connections are and what each may do.
    pub(in crate::node) credentials: Arc<Credentials>,
    /// Some principal is limited: requests are checked.
    pub(in crate::node) limited: bool,
    /// The principals' write quotas, if some principal has one.
    pub(in crate::node) quotas: Option<Arc<Quotas>>,
}

/// What the client server tells a loop.
pub(in crate::node) enum PortCommand {
    /// Start serving clients on this port.
    Serve(ClientPort),
    /// Close every connection and the port; say so on the sender.
    Stop(Sender<()>),
}

/// A `Leaders` or `Status` request, for the status thread: it needs every
/// loop's state, which a loop cannot wait for.
pub(in crate::node) struct SlowCall {
    /// `Status` (else `Leaders`).
    pub(in crate::node) status: bool,
    /// Takes the answer back to the connection's loop.
    pub(in crate::node) answer: Box<dyn FnOnce(Response) + Send>,
}

/// What serving clients needs of the loop, besides its connections.
pub(in crate::node) struct LoopParts<'a> {
    pub(crate) replicas: &'a mut [Replica],
    /// This loop's groups: their index in `replicas`.
    pub(crate) by_group: &'a BTreeMap<GroupId, usize>,
    pub(crate) routing: &'a Routing,
    /// The loop's clock, ms.
    pub(crate) now_ms: u64,
}

/// The client connections of one loop.
pub(in crate::node) struct LoopClients {
    pub(super) port: ClientPort,
    pub(super) me: usize,
    /// This loop's own mailbox, for the answers of calls it hands out.
    pub(super) mail: CoreMailbox,
    pub(super) epoll: Epoll,
    pub(super) conns: Vec<Option<Conn>>,
    pub(super) free: Vec<u32>,
    pub(super) next_generation: u32,
    /// Hello and drain deadlines: (node ms, slot, generation); entries
    /// whose connection moved on are skipped when they come up.
    pub(super) deadlines: BTreeSet<(u64, u32, u32)>,
    /// Connections to pump this turn whatever their readiness (one that
    /// was blocked and is not any more may have requests buffered).
    pub(super) dirty: Vec<u32>,
    pub(super) to_flush: Vec<u32>,
    pub(super) events: Vec<EpollEvent>,
    /// Where a closing connection's last bytes are read and dropped.
    pub(super) scratch: Vec<u8>,
}

impl LoopClients {
    /// Starts serving `port` on loop `me`, whose mailbox is `mail`.
    pub(in crate::node) fn new(
        port: ClientPort,
        me: usize,
        mail: CoreMailbox,
    ) -> std::io::Result<Self> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
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
            events: vec![EpollEvent::empty(); EPOLL_EVENTS_MAX],
            scratch: vec![0; READ_CHUNK_BYTES],
        };
        let events = (libc::EPOLLIN | libc::EPOLLEXCLUSIVE) as u32;
        clients.ctl(Ctl::Add, &*clients.port.listener, events, LISTENER_TOKEN)?;
        Ok(clients)
    }

    /// The descriptor that is readable when a connection (or the
    /// listener) has something: for the loop's poll set.
    pub(crate) fn wake_fd(&self) -> std::os::fd::RawFd {
        self.epoll.0.as_raw_fd()
    }

    /// The next time (node ms) the loop must come back without readiness:
    /// at once while some connection is dirty, else the next deadline.
    pub(crate) fn poll_timeout(&self) -> Option<u64> {
        if !self.dirty.is_empty() {
            return Some(0);
        }
        self.deadlines.first().map(|d| d.0)
    }

    /// Adds, changes or takes out `fd` in the loop's epoll set, with
    /// `events` (`EPOLL*` bits) and `token` (listener, or slot and
    /// generation).
    pub(super) fn ctl(
        &self,
        op: Ctl,
        fd: impl AsFd,
        events: u32,
        token: u64,
    ) -> std::io::Result<()> {
        let mut ev = EpollEvent::new(EpollFlags::from_bits_retain(events as i32), token);
        match op {
            Ctl::Add => self.epoll.add(fd, ev),
            Ctl::Mod => self.epoll.modify(fd, &mut ev),
            Ctl::Del => self.epoll.delete(fd),
        }?;
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
            self.epoll
                .wait(&mut self.events, EpollTimeout::ZERO)
                .unwrap_or(0)
        } else {
            0
        };
        for i in 0..n {
            let token = self.events[i].data();
            let events = self.events[i].events().bits() as u32;
            if token == LISTENER_TOKEN {
                self.accept(parts.now_ms);
                continue;
            }
            let (slot, generation) = ((token >> 32) as u32, token as u32);
            let Some(c) = self.live(slot, generation) else {
                continue;
            };
            if events & libc::EPOLLOUT as u32 != 0 && !c.flushing {
                c.flushing = true;
                self.to_flush.push(slot);
            }
            if events & (libc::EPOLLIN | libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
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
    pub(super) fn live(&mut self, slot: u32, generation: u32) -> Option<&mut Conn> {
        self.conns
            .get_mut(slot as usize)?
            .as_mut()
            .filter(|c| c.generation == generation)
    }

    pub(super) fn mark_dirty(&mut self, slot: u32) {
        if let Some(Some(c)) = self.conns.get_mut(slot as usize) {
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(slot);
            }
        }
    }

    pub(super) fn mark_flush(&mut self, slot: u32) {
        if let Some(Some(c)) = self.conns.get_mut(slot as usize) {
            if !c.flushing {
                c.flushing = true;
                self.to_flush.push(slot);
            }
        }
    }

    /// Reads and serves connection `slot` as far as its bounds allow,
    /// then sets what it waits for.
    pub(super) fn pump(&mut self, slot: u32, parts: &mut LoopParts<'_>) {
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
    pub(super) fn serve_frames(&mut self, slot: u32, parts: &mut LoopParts<'_>) -> bool {
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
    pub(super) fn rearm(&mut self, slot: u32) {
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
            if self.ctl(Ctl::Mod, &c.stream, want, token).is_ok() {
                if let Some(Some(c)) = self.conns.get_mut(slot as usize) {
                    c.interest = want;
                }
            }
        }
    }

    /// The outcome of a ticketed command of this loop's connections.
    pub(crate) fn deliver_command(&mut self, (t, o): crate::node::command::CommandDone) {
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
    pub(super) fn after_answer(&mut self, slot: u32) {
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
}

impl Drop for LoopClients {
    fn drop(&mut self) {
        self.close_all();
    }
}
