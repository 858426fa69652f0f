//! The client-facing TCP server: it moves bytes between client sockets and
//! the sans-IO protocol sessions of `crate::api`, and hands requests to the
//! node's loops through the handle. Appends are pipelined: a request is
//! submitted without waiting and its answer written when the loop calls
//! back, in completion order.
//!
//! Each connection has a reader thread (socket to session to node) and a
//! writer thread (answers to socket); the session, shared by the two, sits
//! behind a mutex of its own, which the node's loops never take: their
//! callbacks only queue the answer for the writer. A malformed frame gets
//! one Error frame, then that connection closes; others carry on.
//!
//! Which connections are taken and kept (budgets for connections before
//! and after their Hello, a limit per source address, the Hello deadline)
//! is decided by `client_admission::Admission`; `client_gate` applies
//! its verdicts to the sockets and counts and logs them; this file only
//! calls the gate at accept, Hello, each read before the Hello, and close.

use super::admin::status_json;
use super::client_admission::{ClientLimits, ConnId};
use super::client_dispatch::{
    answer_response, appended_response, entries_response, error_response, leaders_response,
    long_polls_full, outcome_response, translate, BatchOutcomes, Dispatch, NodeCall,
};
use super::client_gate::{read_some, Gate, Got};
use super::{ListenError, NodeHandle, ProposeError};
use crate::api::{ErrorCode, Incoming, Request, Response, ServerConfig, ServerSession};
use crate::consensus::NodeId;
use crossbeam_channel::{unbounded, Sender};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Authenticated client connections served at once by default
/// (`client.connections_max`; each costs two threads).
pub const CONNECTIONS_MAX: usize = super::client_admission::CONNECTIONS_MAX_DEFAULT;
/// Tail requests waiting at once, over all connections (each waits on a
/// thread); beyond, a Tail is answered Unavailable.
pub const TAILS_MAX: usize = 256;

/// Counts a resource while held.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// Takes one of `max`, if any is free.
    fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        let prev = count.fetch_add(1, Ordering::AcqRel);
        if prev >= max {
            count.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slot(Arc::clone(count)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the writer thread writes.
enum Out {
    /// Bytes already encoded (HelloOk, a closing Error).
    Frame(Vec<u8>),
    /// An answer to encode with the session.
    Answer(u64, Response),
    /// Stop after what is queued.
    Close,
}

/// The running server; stops accepting when dropped.
pub struct ClientServer {
    addr: SocketAddr,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ClientServer {
    /// Listens on `listen` for clients of `node`, which present `token`;
    /// `client_addrs` maps node ids to their client addresses, for
    /// NotLeader redirects. The default [`ClientLimits`].
    pub fn start(
        listen: SocketAddr,
        node: Arc<NodeHandle>,
        token: &[u8],
        client_addrs: BTreeMap<NodeId, String>,
    ) -> Result<ClientServer, ListenError> {
        Self::start_with(listen, node, token, client_addrs, ClientLimits::default())
    }

    /// [`start`](Self::start) with the connection bounds of `limits`
    /// (the config file's `[client]` section).
    pub fn start_with(
        listen: SocketAddr,
        node: Arc<NodeHandle>,
        token: &[u8],
        client_addrs: BTreeMap<NodeId, String>,
        limits: ClientLimits,
    ) -> Result<ClientServer, ListenError> {
        limits.validate().map_err(ListenError::Limits)?;
        let bind_failed = |error| ListenError::Bind {
            server: "the client server",
            addr: listen,
            error,
        };
        let listener = TcpListener::bind(listen).map_err(bind_failed)?;
        let addr = listener.local_addr().map_err(bind_failed)?;
        let cfg = Arc::new(ServerConfig::new(node.id(), token));
        let addrs = Arc::new(client_addrs);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let gate = Arc::new(Gate::new(
            limits,
            node.id(),
            Arc::clone(node.client_counters()),
        ));
        let tails = Arc::new(AtomicUsize::new(0));
        let thread = std::thread::Builder::new()
            .name("quire-clients".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    let Ok(stream) = conn else { continue };
                    let Some(id) = gate.admit(&stream) else {
                        continue; // refused: dropping it closes it
                    };
                    let _ = stream.set_nodelay(true);
                    let (cfg, node, addrs) =
                        (Arc::clone(&cfg), Arc::clone(&node), Arc::clone(&addrs));
                    let (tails, g) = (Arc::clone(&tails), Arc::clone(&gate));
                    let spawned = std::thread::Builder::new()
                        .name("quire-client".into())
                        .spawn(move || {
                            serve(stream, id, &g, cfg, node, addrs, tails);
                            g.closed(id);
                        });
                    if spawned.is_err() {
                        gate.closed(id);
                    }
                }
            })
            .map_err(ListenError::Thread)?;
        Ok(ClientServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ClientServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One connection: this thread reads; a second one writes.
fn serve(
    stream: TcpStream,
    id: ConnId,
    gate: &Gate,
    cfg: Arc<ServerConfig>,
    node: Arc<NodeHandle>,
    addrs: Arc<BTreeMap<NodeId, String>>,
    tails: Arc<AtomicUsize>,
) {
    let Ok(mut writer_stream) = stream.try_clone() else {
        return;
    };
    let session = Arc::new(Mutex::new(ServerSession::new(cfg)));
    let (out, outbox) = unbounded::<Out>();
    let s2 = Arc::clone(&session);
    let writer = std::thread::spawn(move || {
        for o in outbox {
            let bytes = match o {
                Out::Frame(b) => b,
                Out::Answer(id, resp) => match s2.lock() {
                    Ok(mut s) => s.respond(id, &resp),
                    Err(_) => return,
                },
                Out::Close => break,
            };
            if writer_stream.write_all(&bytes).is_err() {
                return;
            }
        }
        let _ = writer_stream.shutdown(Shutdown::Write);
    });
    let peer = stream.peer_addr().ok();
    let mut reader = stream;
    let mut buf = vec![0u8; 64 << 10];
    let mut greeted = false;
    'conn: loop {
        let n = match read_some(&mut reader, &mut buf, gate, id, &mut greeted) {
            Got::Bytes(n) => n,
            Got::Closed => break,
            Got::HelloTimeout => {
                gate.hello_expired(id, peer);
                let why = Response::Error {
                    code: ErrorCode::Timeout,
                    message: format!("no Hello within {} ms", gate.hello_timeout_ms),
                    leader: None,
                };
                if let Ok(mut s) = session.lock() {
                    let _ = out.send(Out::Frame(s.respond(0, &why)));
                }
                break;
            }
        };
        let mut at = 0;
        while at < n {
            let mut requests = Vec::new();
            let failed = {
                let Ok(mut s) = session.lock() else {
                    break 'conn;
                };
                at += s.push(&buf[at..n]);
                loop {
                    match s.poll() {
                        Ok(Some(Incoming::Handshake { id: hello, reply })) => {
                            if gate.authenticate(id, peer) {
                                let _ = out.send(Out::Frame(reply));
                                continue;
                            }
                            let why = Response::Error {
                                code: ErrorCode::Unavailable,
                                message: "too many client connections; retry later".into(),
                                leader: None,
                            };
                            let _ = out.send(Out::Frame(s.respond(hello, &why)));
                            break true;
                        }
                        Ok(Some(Incoming::Request { id, req })) => requests.push((id, req)),
                        Ok(None) => break false,
                        Err(e) => {
                            if e == crate::api::ProtocolError::BadToken {
                                gate.bad_token(peer);
                            }
                            if let Some(frame) = s.close_frame() {
                                let _ = out.send(Out::Frame(frame));
                            }
                            break true;
                        }
                    }
                }
            };
            for (id, req) in requests {
                dispatch(id, req, &node, &addrs, &out, &tails);
            }
            if failed {
                break 'conn;
            }
        }
    }
    let _ = out.send(Out::Close);
    let _ = writer.join();
    // Drain what the client still sends (bounded), so the kernel ends the
    // connection with FIN rather than RST and the Error frame is read.
    let _ = reader.set_read_timeout(Some(Duration::from_millis(100)));
    let mut left = 1 << 20;
    while left > 0 {
        match reader.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => left -= n.min(left),
        }
    }
}

/// Hands request `id` to the node, or answers it at once. What to ask
/// and how to answer is `client_dispatch`'s; this only takes a long
/// poll's slot and routes each answer to the connection's writer.
fn dispatch(
    id: u64,
    req: Request,
    node: &Arc<NodeHandle>,
    addrs: &Arc<BTreeMap<NodeId, String>>,
    out: &Sender<Out>,
    tails: &Arc<AtomicUsize>,
) {
    let call = match translate(req, |group| node.groups().any(|g| g == group)) {
        Dispatch::Call(call) => call,
        Dispatch::Answer(resp) => {
            let _ = out.send(Out::Answer(id, resp));
            return;
        }
        Dispatch::Nothing => return,
    };
    // A long poll waits on the group's loop, not on a thread here; it
    // holds one of the `TAILS_MAX` slots until it is answered.
    let slot = if !call.long_poll() {
        None
    } else if let Some(slot) = Slot::take(tails, TAILS_MAX) {
        Some(slot)
    } else {
        let _ = out.send(Out::Answer(id, long_polls_full(addrs)));
        return;
    };
    let addrs = Arc::clone(addrs);
    let out = out.clone();
    let done = move |resp: Response| {
        drop(slot);
        let _ = out.send(Out::Answer(id, resp));
    };
    match call {
        NodeCall::Append {
            group,
            client_id,
            seq,
            data,
        } => node.append_with(
            group,
            client_id,
            seq,
            data,
            Box::new(move |r| done(appended_response(r, &addrs))),
        ),
        NodeCall::AppendBatch {
            group,
            client_id,
            first_seq,
            items,
        } => {
            // Every item's outcome lands in the batch; the last one answers.
            let batch = Arc::new(Mutex::new((BatchOutcomes::new(items.len()), Some(done))));
            for (i, data) in items.into_iter().enumerate() {
                let (batch, addrs) = (Arc::clone(&batch), Arc::clone(&addrs));
                node.append_with(
                    group,
                    client_id,
                    first_seq + i as u64,
                    data,
                    Box::new(move |r| {
                        let Ok(mut b) = batch.lock() else { return };
                        if let Some(resp) = b.0.add(r, &addrs) {
                            if let Some(done) = b.1.take() {
                                done(resp);
                            }
                        }
                    }),
                );
            }
        }
        NodeCall::Read {
            group,
            from,
            max_entries,
            max_bytes,
            wait_ms,
            stale,
            tail: _,
        } => node.read_waiting(
            group,
            from,
            max_entries,
            max_bytes,
            wait_ms,
            stale,
            Box::new(move |r| done(entries_response(r, &addrs))),
        ),
        NodeCall::State {
            group,
            client_id,
            seq,
            command,
        } => node.state_with(
            group,
            client_id,
            seq,
            command,
            Box::new(move |r| done(outcome_response(r, &addrs))),
        ),
        NodeCall::Query {
            group,
            query,
            wait_ms,
        } => node.query_waiting(
            group,
            query,
            wait_ms,
            Box::new(move |r| done(answer_response(r, &addrs))),
        ),
        NodeCall::Leaders => done(leaders_response(node.status().as_ref(), &addrs)),
        NodeCall::Status => done(match node.status() {
            Some(s) => Response::StatusJson {
                json: status_json(&s).to_string(),
            },
            None => error_response(ProposeError::Stopping, &addrs),
        }),
    }
}
