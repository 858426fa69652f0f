//! A client connection's life on its loop: accepted (admitted by the
//! gate or refused with a counted reason; a TLS session begun), its hello
//! and drain deadlines, and closed. Nothing here waits on a peer:
//! accepts are non-blocking and at most `ACCEPTS_PER_TURN_MAX` a turn.

use super::conn::{Conn, Phase};
use super::conns::{Ctl, LoopClients, ACCEPTS_PER_TURN_MAX, LISTENER_TOKEN};
use crate::api::{ErrorCode, Response, ServerSession};
use crate::tls::TlsChannel;
use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::Shutdown;
use std::sync::Arc;

impl LoopClients {
    pub(super) fn accept(&mut self, now_ms: u64) {
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
            if self.ctl(Ctl::Add, &stream, interest, token).is_err() {
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
    pub(super) fn expire(&mut self, now_ms: u64) {
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

    /// Lets connection `slot` go.
    pub(super) fn close(&mut self, slot: u32) {
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::take) else {
            return;
        };
        // The gate may hold a clone of the socket (before the Hello),
        // which would keep it in the epoll set: take it out first.
        let _ = self.ctl(Ctl::Del, &c.stream, 0, 0);
        self.port.gate.closed(c.id);
        self.free.push(slot);
    }

    /// Closes every connection (the server is stopping).
    pub(crate) fn close_all(&mut self) {
        let _ = self.ctl(Ctl::Del, &*self.port.listener, 0, LISTENER_TOKEN);
        for slot in 0..self.conns.len() as u32 {
            if let Some(Some(c)) = self.conns.get(slot as usize) {
                let _ = c.stream.shutdown(Shutdown::Both);
            }
            self.close(slot);
        }
    }
}
