//! The client protocol's sessions under the seed: each log client keeps a
//! connection to each node it talks to, an `api::ClientSession` at its
//! end and an `api::ServerSession` at the node's, joined by a simulated
//! in-order byte pipe (bytes arrive after the network's delay, as world
//! events, never before bytes sent earlier the same way). A connection
//! opens with the Hello and the cluster's token, as the production
//! client's does; a crash of the node's replica closes it, and bytes on
//! the way are lost with it.

use super::checker::Violation;
use super::world::{Event, World};
use crate::api::{ClientConfig, ClientSession, Incoming, Received, Request, Response};
use crate::api::{ServerConfig, ServerSession};
use crate::client::retry::CallError;
use rand::Rng;
use std::sync::Arc;

/// The cluster's client token, as every node's `ServerConfig` holds it.
const TOKEN: &[u8] = b"quire-sim client token";

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

impl World {
    /// The connection from client `c` to node `n`, opened (Hello first,
    /// requests pipelined behind it) if there is none.
    fn conn(&mut self, c: usize, n: usize) -> u64 {
        if let Some(conn) = self.clients[c].conns.get(&n) {
            return conn.id;
        }
        self.next_op += 1;
        let id = self.next_op;
        let mut client = ClientSession::new(ClientConfig::new(TOKEN));
        let server = ServerSession::new(Arc::new(ServerConfig::new(n as u64 + 1, TOKEN)));
        let (_, hello) = client.hello().expect("a new session takes its Hello");
        self.clients[c].conns.insert(
            n,
            Conn {
                id,
                client,
                server,
                to_server_ms: 0,
                to_client_ms: 0,
            },
        );
        self.pipe_send(c, n, true, hello);
        id
    }

    /// Writes `request` on client `c`'s connection to node `n`: the
    /// connection's id and the request's, or `None` if it is closed.
    pub(crate) fn write_request(
        &mut self,
        c: usize,
        n: usize,
        request: &Request,
    ) -> Option<(u64, u64)> {
        let conn_id = self.conn(c, n);
        let conn = self.clients[c].conns.get_mut(&n).expect("just opened");
        match conn.client.request(request) {
            Ok((id, frame)) => {
                self.pipe_send(c, n, true, frame);
                Some((conn_id, id))
            }
            Err(_) => {
                self.clients[c].conns.remove(&n);
                None
            }
        }
    }

    /// Bytes leave one end of client `c`'s connection to node `n`.
    fn pipe_send(&mut self, c: usize, n: usize, to_server: bool, bytes: Vec<u8>) {
        let delay = self.p.net_delay_min_ms + self.rng.gen_range(0..=self.p.net_jitter_ms);
        let Some(conn) = self.clients[c].conns.get_mut(&n) else {
            return;
        };
        let last = if to_server {
            &mut conn.to_server_ms
        } else {
            &mut conn.to_client_ms
        };
        // In order: never before what was sent earlier the same way.
        let at = (self.now + delay).max(*last);
        *last = at;
        let conn = conn.id;
        self.schedule(
            at,
            Event::Pipe {
                client: c,
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
        c: usize,
        n: usize,
        conn: u64,
        to_server: bool,
        bytes: &[u8],
    ) -> Result<(), Violation> {
        if self.clients[c].conns.get(&n).is_none_or(|k| k.id != conn) {
            return Ok(()); // closed since
        }
        if to_server {
            self.server_read(c, n, conn, bytes)
        } else {
            self.client_read(c, n, conn, bytes)
        }
    }

    /// The node's end reads, as its server's connection loop does.
    fn server_read(
        &mut self,
        c: usize,
        n: usize,
        conn: u64,
        bytes: &[u8],
    ) -> Result<(), Violation> {
        let g = self.clients[c].group;
        let mut frames = Vec::new();
        let mut requests = Vec::new();
        let k = self.clients[c].conns.get_mut(&n).expect("checked");
        let mut at = 0;
        let mut failed = false;
        while at < bytes.len() && !failed {
            let took = k.server.push(&bytes[at..]);
            at += took;
            loop {
                match k.server.poll() {
                    Ok(Some(Incoming::Handshake { reply, .. })) => frames.push(reply),
                    Ok(Some(Incoming::Request { id, req })) => requests.push((id, req)),
                    Ok(None) => break,
                    Err(_) => {
                        frames.extend(k.server.close_frame());
                        failed = true;
                        break;
                    }
                }
            }
            if took == 0 && !failed {
                break;
            }
        }
        for f in frames {
            self.pipe_send(c, n, false, f);
        }
        if requests.is_empty() {
            return Ok(());
        }
        for (id, req) in requests {
            self.serve_hosted(c, n, conn, id, req);
        }
        self.drive(n, g)
    }

    /// The node answered request `id` on connection `conn`: the answer
    /// goes back through the session, if the connection is still open.
    pub(crate) fn respond(&mut self, c: usize, n: usize, conn: u64, id: u64, resp: &Response) {
        let Some(k) = self.clients[c].conns.get_mut(&n).filter(|k| k.id == conn) else {
            return;
        };
        let frame = k.server.respond(id, resp);
        self.pipe_send(c, n, false, frame);
    }

    /// The client's end reads, as the production client's `read_reply`.
    fn client_read(
        &mut self,
        c: usize,
        n: usize,
        conn: u64,
        bytes: &[u8],
    ) -> Result<(), Violation> {
        let mut got = Vec::new();
        let k = self.clients[c].conns.get_mut(&n).expect("checked");
        let mut at = 0;
        let mut lost = None;
        while at < bytes.len() && lost.is_none() {
            let took = k.client.push(&bytes[at..]);
            at += took;
            loop {
                match k.client.poll() {
                    Ok(Some(Received::Response { id, resp })) => got.push((id, Ok(resp))),
                    Ok(Some(Received::ConnectionError { code, message })) => {
                        lost = Some(CallError::refused(code, message));
                        break;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        lost = Some(CallError::Lost(format!("protocol error: {e}")));
                        break;
                    }
                }
            }
            if took == 0 && lost.is_none() {
                break;
            }
        }
        for (id, r) in got {
            if let Ok(Response::HelloOk { node }) = r {
                self.clients[c].leaders.connected(n, node);
                continue;
            }
            self.client_answered(c, n, conn, id, r)?;
        }
        if let Some(e) = lost {
            self.clients[c].conns.remove(&n);
            self.connection_lost(c, n, conn, e)?;
        }
        Ok(())
    }
}
