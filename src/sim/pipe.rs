//! The client protocol's sessions under the seed: each simulated client
//! (a log client, or a ledger or queue client) keeps a connection to each
//! node it talks to, an `api::ClientSession` at its end and an
//! `api::ServerSession` at the node's, joined by a simulated in-order
//! byte pipe (bytes arrive after the network's delay, as world events,
//! never before bytes sent earlier the same way). A connection opens
//! with the Hello and the cluster's token, as the production client's
//! does; a crash of the node's replica closes it, and bytes on the way
//! are lost with it.

use super::checker::Violation;
use super::world::{Event, World};
use crate::api::{ClientConfig, ClientSession, Incoming, ProtocolError, Received, Request};
use crate::api::{Response, ServerConfig, ServerSession};
use crate::client::retry::CallError;
use rand::Rng;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The cluster's client token, as every node's `ServerConfig` holds it.
const TOKEN: &[u8] = b"quire-sim client token";

/// Which simulated client a connection belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Caller {
    /// Log client `c` (`World::clients`).
    Log(usize),
    /// Ledger or queue client `c` (`World::state_clients`).
    State(usize),
}

/// One connection from a client to a node.
#[derive(Debug)]
pub(crate) struct Conn {
    /// Unique in the run: bytes and answers of a closed one are dropped.
    pub(crate) id: u64,
    client: ClientSession,
    server: ServerSession,
    /// When the last bytes each way arrive, simulated ms.
    to_server_ms: u64,
    to_client_ms: u64,
}

/// A client's open connections, by node.
pub(crate) type Conns = BTreeMap<usize, Conn>;

/// One end of a session, as a connection loop reads it: bytes in, messages out.
trait SessionEnd {
    type Message;
    fn push(&mut self, bytes: &[u8]) -> usize;
    fn poll(&mut self) -> Result<Option<Self::Message>, ProtocolError>;
}

impl SessionEnd for ServerSession {
    type Message = Incoming;
    fn push(&mut self, bytes: &[u8]) -> usize {
        ServerSession::push(self, bytes)
    }
    fn poll(&mut self) -> Result<Option<Incoming>, ProtocolError> {
        ServerSession::poll(self)
    }
}

impl SessionEnd for ClientSession {
    type Message = Received;
    fn push(&mut self, bytes: &[u8]) -> usize {
        ClientSession::push(self, bytes)
    }
    fn poll(&mut self) -> Result<Option<Received>, ProtocolError> {
        ClientSession::poll(self)
    }
}

/// Reads `bytes` into `end` as a connection loop does (push, poll until
/// it yields nothing, push the rest): the messages in order, up to and
/// including the first that `last` says ends the connection, and the
/// protocol error that ended it, if one did.
fn read_all<E: SessionEnd>(
    end: &mut E,
    bytes: &[u8],
    last: impl Fn(&E::Message) -> bool,
) -> (Vec<E::Message>, Option<ProtocolError>) {
    let mut messages = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let took = end.push(&bytes[at..]);
        at += took;
        loop {
            match end.poll() {
                Ok(Some(m)) => {
                    let done = last(&m);
                    messages.push(m);
                    if done {
                        return (messages, None);
                    }
                }
                Ok(None) => break,
                Err(e) => return (messages, Some(e)),
            }
        }
        if took == 0 {
            break;
        }
    }
    (messages, None)
}

impl World {
    /// The open connections of client `who`.
    pub(crate) fn conns(&mut self, who: Caller) -> &mut Conns {
        match who {
            Caller::Log(c) => &mut self.clients[c].conns,
            Caller::State(c) => self.state_clients[c].conns_mut(),
        }
    }

    /// The group client `who` works on.
    pub(crate) fn caller_group(&self, who: Caller) -> usize {
        match who {
            Caller::Log(c) => self.clients[c].group,
            Caller::State(c) => self.state_clients[c].group(),
        }
    }

    /// The connection from client `who` to node `n`, opened (Hello first,
    /// requests pipelined behind it) if there is none.
    fn conn(&mut self, who: Caller, n: usize) -> u64 {
        if let Some(conn) = self.conns(who).get(&n) {
            return conn.id;
        }
        self.next_op += 1;
        let id = self.next_op;
        let mut client = ClientSession::new(ClientConfig::new(TOKEN));
        let server = ServerSession::new(Arc::new(ServerConfig::new(n as u64 + 1, TOKEN)));
        let (_, hello) = client.hello().expect("a new session takes its Hello");
        self.conns(who).insert(
            n,
            Conn {
                id,
                client,
                server,
                to_server_ms: 0,
                to_client_ms: 0,
            },
        );
        self.pipe_send(who, n, true, hello);
        id
    }

    /// Writes `request` on client `who`'s connection to node `n`: the
    /// connection's id and the request's, or `None` if it is closed.
    pub(crate) fn write_request(
        &mut self,
        who: Caller,
        n: usize,
        request: &Request,
    ) -> Option<(u64, u64)> {
        let conn_id = self.conn(who, n);
        let conn = self.conns(who).get_mut(&n).expect("just opened");
        match conn.client.request(request) {
            Ok((id, frame)) => {
                self.pipe_send(who, n, true, frame);
                Some((conn_id, id))
            }
            Err(_) => {
                self.conns(who).remove(&n);
                None
            }
        }
    }

    /// `write_request` for several requests at once, their frames in one
    /// write (so the node reads them in one turn, as a pipelining client's
    /// are): the connection and each request's id, in order; `None` if the
    /// session refused one (nothing is sent then).
    pub(crate) fn write_requests(
        &mut self,
        who: Caller,
        n: usize,
        requests: &[Request],
    ) -> Option<(u64, Vec<u64>)> {
        let conn_id = self.conn(who, n);
        let conn = self.conns(who).get_mut(&n).expect("just opened");
        let mut bytes = Vec::new();
        let mut ids = Vec::new();
        for request in requests {
            match conn.client.request(request) {
                Ok((id, frame)) => {
                    bytes.extend_from_slice(&frame);
                    ids.push(id);
                }
                Err(_) => {
                    self.conns(who).remove(&n);
                    return None;
                }
            }
        }
        self.pipe_send(who, n, true, bytes);
        Some((conn_id, ids))
    }

    /// Bytes leave one end of client `who`'s connection to node `n`.
    fn pipe_send(&mut self, who: Caller, n: usize, to_server: bool, bytes: Vec<u8>) {
        let delay = self.p.net_delay_min_ms + self.rng.gen_range(0..=self.p.net_jitter_ms);
        let now = self.now;
        let Some(conn) = self.conns(who).get_mut(&n) else {
            return;
        };
        let last = if to_server {
            &mut conn.to_server_ms
        } else {
            &mut conn.to_client_ms
        };
        // In order: never before what was sent earlier the same way.
        let at = (now + delay).max(*last);
        *last = at;
        let conn = conn.id;
        self.schedule(
            at,
            Event::Pipe {
                client: who,
                node: n,
                conn,
                to_server,
                bytes,
            },
        );
    }

    /// Bytes arrive at one end of a connection.
    pub(crate) fn pipe_arrived(
        &mut self,
        who: Caller,
        n: usize,
        conn: u64,
        to_server: bool,
        bytes: &[u8],
    ) -> Result<(), Violation> {
        if self.conns(who).get(&n).is_none_or(|k| k.id != conn) {
            return Ok(()); // closed since
        }
        if to_server {
            self.server_read(who, n, conn, bytes)
        } else {
            self.client_read(who, n, conn, bytes)
        }
    }

    /// The node's end reads, as its server's connection loop does.
    fn server_read(
        &mut self,
        who: Caller,
        n: usize,
        conn: u64,
        bytes: &[u8],
    ) -> Result<(), Violation> {
        let g = self.caller_group(who);
        let k = self.conns(who).get_mut(&n).expect("checked");
        let (incoming, failed) = read_all(&mut k.server, bytes, |_| false);
        let mut frames = Vec::new();
        let mut requests = Vec::new();
        for m in incoming {
            match m {
                Incoming::Handshake { reply, .. } => frames.push(reply),
                Incoming::Request { id, req } => requests.push((id, req)),
            }
        }
        if failed.is_some() {
            frames.extend(k.server.close_frame());
        }
        for f in frames {
            self.pipe_send(who, n, false, f);
        }
        if requests.is_empty() {
            return Ok(());
        }
        for (id, req) in requests {
            self.serve_hosted(who, n, conn, id, req);
        }
        self.drive(n, g)
    }

    /// The node answered request `id` on connection `conn`: the answer
    /// goes back through the session, if the connection is still open.
    pub(crate) fn respond(&mut self, who: Caller, n: usize, conn: u64, id: u64, resp: &Response) {
        let Some(k) = self.conns(who).get_mut(&n).filter(|k| k.id == conn) else {
            return;
        };
        let frame = k.server.respond(id, resp);
        self.pipe_send(who, n, false, frame);
    }

    /// The client's end reads, as the production client's `read_reply`.
    fn client_read(
        &mut self,
        who: Caller,
        n: usize,
        conn: u64,
        bytes: &[u8],
    ) -> Result<(), Violation> {
        let k = self.conns(who).get_mut(&n).expect("checked");
        let closed = |m: &Received| matches!(m, Received::ConnectionError { .. });
        let (received, failed) = read_all(&mut k.client, bytes, closed);
        let mut lost = failed.map(|e| CallError::Lost(format!("protocol error: {e}")));
        for m in received {
            match m {
                Received::Response {
                    resp: Response::HelloOk { node },
                    ..
                } => {
                    if let Caller::Log(c) = who {
                        self.clients[c].leaders.connected(n, node);
                    }
                }
                Received::Response { id, resp } => match who {
                    Caller::Log(c) => self.client_answered(c, n, conn, id, Ok(resp))?,
                    Caller::State(c) => self.state_client_answered(c, n, conn, id, resp)?,
                },
                Received::ConnectionError { code, message } => {
                    lost = Some(CallError::refused(code, message));
                }
            }
        }
        if let Some(e) = lost {
            self.conns(who).remove(&n);
            match who {
                Caller::Log(c) => self.connection_lost(c, n, conn, e)?,
                Caller::State(c) => self.state_connection_lost(c, n, conn),
            }
        }
        Ok(())
    }
}
