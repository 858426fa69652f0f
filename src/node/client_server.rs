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
use super::client_gate::{read_some, Gate, Got};
use super::{ListenError, NodeHandle, ProposeError};
use crate::api::{ErrorCode, Incoming, LeaderInfo, Request, Response, ServerConfig, ServerSession};
use crate::consensus::NodeId;
use crossbeam_channel::{unbounded, Sender};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Longest a Tail request waits for entries.
const TAIL_WAIT_MAX: Duration = Duration::from_secs(30);
/// Entries in one Read answer at most.
const READ_ENTRIES_MAX: usize = 4096;
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

/// The protocol's answer for a node error.
fn error_response(e: ProposeError, addrs: &BTreeMap<NodeId, String>) -> Response {
    let (code, leader) = match &e {
        ProposeError::NotLeader(l) => (
            ErrorCode::NotLeader,
            l.map(|l| (l, addrs.get(&l).cloned().unwrap_or_default())),
        ),
        ProposeError::DiskFull => (ErrorCode::DiskFull, None),
        ProposeError::Timeout => (ErrorCode::Timeout, None),
        // Another node may serve it, or the outcome is unknown: the
        // client retries (the same seq, so nothing applies twice).
        ProposeError::Lost
        | ProposeError::LogStopped(_)
        | ProposeError::Stopping
        | ProposeError::Compacted { .. }
        | ProposeError::Unreadable(_)
        | ProposeError::Internal(_) => (ErrorCode::Unavailable, None),
        ProposeError::UnknownGroup(_) => (ErrorCode::UnknownGroup, None),
        // Permanent: the same seq is refused again, wherever it is sent.
        ProposeError::SeqForgotten { .. } => (ErrorCode::Conflict, None),
        ProposeError::Refused(r) => (refusal_code(*r), None),
        ProposeError::TooLarge { .. } => (ErrorCode::TooLarge, None),
        ProposeError::Conflict { .. } => (ErrorCode::Conflict, None),
        // Only membership changes give these, and clients cannot ask one.
        ProposeError::Invalid(_) => (ErrorCode::BadRequest, None),
        ProposeError::Busy(_) | ProposeError::Lagging(_) => (ErrorCode::Unavailable, None),
    };
    Response::Error {
        code,
        message: e.to_string(),
        leader,
    }
}

/// The protocol's code for a state-machine refusal.
fn refusal_code(e: crate::state::Error) -> ErrorCode {
    use crate::state::Error as E;
    match e {
        E::Fenced => ErrorCode::Fenced,
        E::NoSuchLedger | E::NoSuchQueue => ErrorCode::NotFound,
        E::NotWriter
        | E::Closed
        | E::LacBeyondEnd
        | E::QueueExists
        | E::Forgotten
        | E::Conflict => ErrorCode::Conflict,
        E::Limit(_) => ErrorCode::TooLarge,
        E::Invalid => ErrorCode::BadRequest,
        E::AlreadyApplied => ErrorCode::Internal,
    }
}

fn bad_request(message: &str) -> Response {
    Response::Error {
        code: ErrorCode::BadRequest,
        message: message.into(),
        leader: None,
    }
}

fn dispatch(
    id: u64,
    req: Request,
    node: &Arc<NodeHandle>,
    addrs: &Arc<BTreeMap<NodeId, String>>,
    out: &Sender<Out>,
    tails: &Arc<AtomicUsize>,
) {
    let answer = |out: &Sender<Out>, resp: Response| {
        let _ = out.send(Out::Answer(id, resp));
    };
    if let Some(group) = request_group(&req) {
        if !node.groups().any(|g| g == group) {
            let resp = Response::Error {
                code: ErrorCode::UnknownGroup,
                message: format!("group {group} is not on this node"),
                leader: None,
            };
            return answer(out, resp);
        }
    }
    match req {
        Request::Append {
            group,
            client_id,
            seq,
            data,
        } => {
            let (out, addrs) = (out.clone(), Arc::clone(addrs));
            node.append_with(
                group,
                client_id,
                seq,
                data,
                Box::new(move |r| {
                    let resp = match r {
                        Ok(index) => Response::Appended { index },
                        Err(e) => error_response(e, &addrs),
                    };
                    let _ = out.send(Out::Answer(id, resp));
                }),
            );
        }
        Request::AppendBatch {
            group,
            client_id,
            first_seq,
            items,
        } => {
            if items.is_empty() {
                let resp = Response::Error {
                    code: ErrorCode::BadRequest,
                    message: "an empty batch".into(),
                    leader: None,
                };
                return answer(out, resp);
            }
            // Every item's outcome lands in `acc`; the last one answers.
            let count = items.len();
            let acc = Arc::new(Mutex::new((Vec::with_capacity(count), count)));
            for (i, data) in items.into_iter().enumerate() {
                let (out, addrs, acc) = (out.clone(), Arc::clone(addrs), Arc::clone(&acc));
                node.append_with(
                    group,
                    client_id,
                    first_seq + i as u64,
                    data,
                    Box::new(move |r| {
                        let Ok(mut a) = acc.lock() else { return };
                        a.0.push(r);
                        a.1 -= 1;
                        if a.1 > 0 {
                            return;
                        }
                        let results = std::mem::take(&mut a.0);
                        let resp = match results.into_iter().collect::<Result<Vec<_>, _>>() {
                            Ok(indexes) => Response::AppendedBatch {
                                first_index: indexes.iter().copied().min().unwrap_or(0),
                                count: indexes.len() as u32,
                            },
                            Err(e) => error_response(e, &addrs),
                        };
                        let _ = out.send(Out::Answer(id, resp));
                    }),
                );
            }
        }
        Request::Read {
            group,
            from,
            max_entries,
            max_bytes,
            stale,
        } => {
            let (out, addrs) = (out.clone(), Arc::clone(addrs));
            let max_entries = (max_entries as usize).clamp(1, READ_ENTRIES_MAX);
            node.read_with(
                group,
                from,
                max_entries,
                max_bytes as usize,
                stale,
                Box::new(move |r| {
                    let _ = out.send(Out::Answer(id, entries_response(r, &addrs)));
                }),
            );
        }
        Request::Tail {
            group,
            from,
            wait_ms,
            stale,
        } => {
            // The group's loop keeps the tail and answers it as soon as an
            // entry is applied there; no thread waits here. It holds one of
            // the `TAILS_MAX` slots until then.
            let Some(slot) = Slot::take(tails, TAILS_MAX) else {
                let why = ProposeError::Busy("too many long polls waiting".into());
                return answer(out, error_response(why, addrs));
            };
            let wait = Duration::from_millis(u64::from(wait_ms)).min(TAIL_WAIT_MAX);
            let (out, addrs) = (out.clone(), Arc::clone(addrs));
            node.read_waiting(
                group,
                from,
                READ_ENTRIES_MAX,
                usize::MAX,
                wait.as_millis() as u32,
                stale,
                Box::new(move |r| {
                    drop(slot);
                    let _ = out.send(Out::Answer(id, entries_response(r, &addrs)));
                }),
            );
        }
        Request::Leaders => {
            let resp = match node.status() {
                Some(s) => Response::LeaderMap {
                    groups: s
                        .groups
                        .iter()
                        .map(|g| LeaderInfo {
                            group: g.group,
                            leader: g.leader.unwrap_or(0),
                            addr: g
                                .leader
                                .and_then(|l| addrs.get(&l).cloned())
                                .unwrap_or_default(),
                        })
                        .collect(),
                },
                None => error_response(ProposeError::Stopping, addrs),
            };
            answer(out, resp);
        }
        Request::Status => {
            let resp = match node.status() {
                Some(s) => Response::StatusJson {
                    json: status_json(&s).to_string(),
                },
                None => error_response(ProposeError::Stopping, addrs),
            };
            answer(out, resp);
        }
        Request::Command {
            group,
            client_id,
            seq,
            command,
        } => {
            let Some(command) = crate::state::Command::decode(&command) else {
                return answer(out, bad_request("the command does not decode"));
            };
            let (out, addrs) = (out.clone(), Arc::clone(addrs));
            node.state_with(
                group,
                client_id,
                seq,
                command,
                Box::new(move |r| {
                    let resp = match r {
                        Ok(o) => Response::Outcome {
                            outcome: o.encode(),
                        },
                        Err(e) => error_response(e, &addrs),
                    };
                    let _ = out.send(Out::Answer(id, resp));
                }),
            );
        }
        Request::Query {
            group,
            wait_ms,
            query,
        } => {
            let Some(query) = crate::state::Query::decode(&query) else {
                return answer(out, bad_request("the query does not decode"));
            };
            let waits = wait_ms > 0 && matches!(query, crate::state::Query::ReadLedger { .. });
            if !waits {
                let (out, addrs) = (out.clone(), Arc::clone(addrs));
                node.query_with(
                    group,
                    query,
                    Box::new(move |r| {
                        let _ = out.send(Out::Answer(id, answer_response(r, &addrs)));
                    }),
                );
                return;
            }
            // A long poll for entries past the LAC: the leader's loop keeps
            // it and answers as soon as an entry is confirmed; no thread
            // waits here. It holds one of the `TAILS_MAX` slots until then.
            let Some(slot) = Slot::take(tails, TAILS_MAX) else {
                let why = ProposeError::Busy("too many long polls waiting".into());
                return answer(out, error_response(why, addrs));
            };
            let wait = (Duration::from_millis(u64::from(wait_ms)).min(TAIL_WAIT_MAX)).as_millis();
            let (out, addrs) = (out.clone(), Arc::clone(addrs));
            node.query_waiting(
                group,
                query,
                wait as u32,
                Box::new(move |r| {
                    drop(slot);
                    let _ = out.send(Out::Answer(id, answer_response(r, &addrs)));
                }),
            );
        }
        Request::Hello { .. } => {} // handled by the session
    }
}

fn request_group(req: &Request) -> Option<u32> {
    match req {
        Request::Append { group, .. }
        | Request::AppendBatch { group, .. }
        | Request::Read { group, .. }
        | Request::Tail { group, .. }
        | Request::Command { group, .. }
        | Request::Query { group, .. } => Some(*group),
        _ => None,
    }
}

fn answer_response(
    r: Result<crate::state::Answer, ProposeError>,
    addrs: &BTreeMap<NodeId, String>,
) -> Response {
    match r {
        Ok(a) => Response::Answer { answer: a.encode() },
        Err(e) => error_response(e, addrs),
    }
}

fn entries_response(
    r: Result<Vec<(u64, u64, Vec<u8>)>, ProposeError>,
    addrs: &BTreeMap<NodeId, String>,
) -> Response {
    match r {
        Ok(v) => Response::Entries {
            entries: v
                .into_iter()
                .map(|(index, term, data)| crate::api::Entry { index, term, data })
                .collect(),
        },
        Err(e) => error_response(e, addrs),
    }
}
