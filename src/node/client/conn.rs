//! One client connection of a loop: its socket and TLS session, the
//! sans-IO session, the answers waiting to be written and the bounds on
//! them, where it is in its life (`Phase`), and a long-poll slot it holds.
//! Plain data and small steps on it, which never touch the socket: the
//! loop's work on its connections is `conns`'s.

use crate::api::{Response, ServerSession};
use crate::consensus::NodeId;
use crate::node::client::admission::ConnId;
use crate::node::client::dispatch::{appended_response, BatchOutcomes};
use crate::node::command::{ClientTicket, ProposeError};
use crate::tls::TlsChannel;
use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, TcpStream};
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

/// One of the node's long-poll slots, held until the poll is answered.
pub(super) struct TailSlot(Arc<AtomicUsize>);

impl TailSlot {
    /// Takes one of `max`, if any is free.
    pub(super) fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<TailSlot> {
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
pub(super) enum Phase {
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
pub(super) struct Conn {
    pub(super) stream: TcpStream,
    /// The TLS session the bytes go through, if the node serves TLS.
    pub(super) tls: Option<Box<TlsChannel>>,
    pub(super) session: ServerSession,
    pub(super) id: ConnId,
    pub(super) peer: Option<SocketAddr>,
    pub(super) generation: u32,
    pub(super) greeted: bool,
    /// Answers not yet written, from `out_at` on.
    pub(super) out: Vec<u8>,
    pub(super) out_at: usize,
    /// The `AppendBatch` requests waiting for their items' outcomes.
    pub(super) batches: HashMap<u64, BatchOutcomes>,
    /// Requests other than appends handed out and not yet answered, whose
    /// answers can be large (`CONN_CALLS_IN_FLIGHT_MAX`).
    pub(super) calls_in_flight: usize,
    /// The events registered in the epoll set.
    pub(super) interest: u32,
    pub(super) phase: Phase,
    /// In the loop's `dirty` list (to pump without readiness).
    pub(super) dirty: bool,
    /// In the loop's `to_flush` list.
    pub(super) flushing: bool,
    /// Over its principal's quota: not read from, nor its buffered
    /// requests served, until this time (node ms; in the loop's
    /// `deadlines` too).
    pub(super) held_until_ms: Option<u64>,
}

impl Conn {
    pub(super) fn unwritten(&self) -> usize {
        self.out.len() - self.out_at
    }

    /// Whether anything waits to go out: answers, or TLS records
    /// (handshake, data, an alert) its session holds.
    pub(super) fn wants_write(&self) -> bool {
        self.unwritten() > 0 || self.tls.as_ref().is_some_and(|t| t.wants_write())
    }

    /// Whether the loop must stop reading requests from it for now.
    pub(super) fn blocked(&self, requests_in_flight_max: usize) -> bool {
        // No room: a whole frame waits (read straight into the session's
        // buffer, only what it can take).
        self.held_until_ms.is_some()
            || self.session.room_bytes() == 0
            || self.unwritten() >= CONN_OUT_BYTES_MAX
            || self.session.in_flight() >= requests_in_flight_max
            || self.calls_in_flight >= CONN_CALLS_IN_FLIGHT_MAX
    }

    /// The answer `resp` to request `id`, queued for this turn's write.
    pub(super) fn respond(&mut self, id: u64, resp: &Response) {
        self.compact_out();
        self.session.respond_into(id, resp, &mut self.out);
    }

    pub(super) fn queue(&mut self, bytes: &[u8]) {
        self.compact_out();
        self.out.extend_from_slice(bytes);
    }

    /// Drops the written front of `out` once it is half of it.
    pub(super) fn compact_out(&mut self) {
        if self.out_at > 0 && self.out_at >= self.out.len() / 2 {
            self.out.drain(..self.out_at);
            self.out_at = 0;
        }
    }

    /// Ticket outcome `r`: a lone append's answer, or one item of a batch
    /// (answered when it is the batch's last).
    pub(super) fn outcome(
        &mut self,
        t: ClientTicket,
        r: Result<u64, ProposeError>,
        addrs: &AddrMap,
    ) {
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

pub(super) type AddrMap = BTreeMap<NodeId, String>;
