//! The Rust client library: connects to any node of a cluster, learns
//! which node leads each group, follows NotLeader redirects, reconnects
//! after a failover, and retries appends safely: every append carries this
//! client's id and a sequence number, so a retry is applied once and
//! answered with the original index.
//!
//! Blocking calls. `append` sends one append and waits; `append_all`
//! pipelines many on the leader's connection through a [`Producer`], up
//! to `in_flight` at once, packing small ones into batch requests
//! (`AppendBatch`), and falls back to one-by-one retries (same sequence
//! numbers) for whatever a failover interrupts.
//!
//! The [`Producer`] (`producer.rs`) is the pipelined client: an
//! application thread keeps hundreds of appends in flight and takes each
//! one's outcome back by its ticket, in order per group. The
//! [`CommandPipeline`] (`pipeline.rs`) does the same for ledger and queue
//! commands (produces, ledger adds, acks), and the [`Consumer`]
//! (`consumer.rs`) consumes a queue through one, with a prefetch window
//! and batched acks.
//!
//! A refusal of the connection itself (a wrong token, a protocol version
//! the node does not speak, a TLS handshake that fails) is permanent and
//! the same on every node: the call returns it at once, without retrying
//! this node or any other.
//!
//! [`Client::with_tls`] and [`Producer::with_tls`] speak TLS to the nodes
//! (`tls::ClientTls`: the CA to trust, and a client certificate for
//! nodes that ask for one); without it they speak plain TCP.

use crate::api::{ClientConfig, ClientSession, ErrorCode, LeaderInfo, Received, Request, Response};
use crate::consensus::NodeId;
use crate::tls::{looks_like_tls, tls_failure, ClientTls};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An entry read back: index, term and the appended bytes.
pub use crate::api::Entry;
pub use crate::state::ledger::LedgerInfo;
pub use crate::state::queue::{Delivery, QueueInfo};
pub use consumer::{AckDone, Consumer, ConsumerConfig, ConsumerStats};
pub use id::{os_random_u64, random_client_id};
pub use pipeline::{CommandCompletion, CommandPipeline, PipelineConfig, PipelineStats};
pub use producer::{Completion, Producer, ProducerConfig, ProducerStats, SendError, Ticket};
pub use retry::{Attempts, CallError, Leaders, Verdict};
pub use state::LedgerWriter;

mod consumer;
mod id;
mod link;
mod pipeline;
mod producer;
pub mod retry;
mod state;
#[cfg(test)]
mod tests;

/// Why a client call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientError {
    /// No node answered within the deadline; for an append, the outcome is
    /// unknown (retrying with the same sequence number is safe).
    Unavailable(String),
    /// The cluster refused the request for good (bad request, too large,
    /// unknown group, wrong token...).
    Refused(ErrorCode, String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Unavailable(why) => {
                write!(
                    f,
                    "cluster unavailable: {}",
                    without(why, &["unavailable: "])
                )
            }
            ClientError::Refused(code, why) => {
                let own = format!("{code}: ");
                write!(
                    f,
                    "refused ({code}): {}",
                    without(why, &["refused: ", &own])
                )
            }
        }
    }
}

/// `why` less the words the error already says in front of it: a reason
/// relayed through the node and the retry loop arrives as "unavailable:
/// unavailable: …" or "refused: …", and an error should read once.
fn without<'a>(why: &'a str, prefixes: &[&str]) -> &'a str {
    let mut w = why;
    while let Some(rest) = prefixes.iter().find_map(|p| w.strip_prefix(p)) {
        w = rest;
    }
    w
}

impl std::error::Error for ClientError {}

struct Conn {
    stream: Stream,
    session: ClientSession,
    node: NodeId,
}

/// A connection's bytes: plain TCP, or TLS over it (rustls' blocking
/// stream: the handshake runs in the first write and read).
enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// A failed read or write of a connection as the retry policy takes it:
/// a TLS failure (an untrusted certificate, the node refusing ours) is
/// for good; anything else loses the connection.
pub(crate) fn io_failure(addr: SocketAddr, e: &std::io::Error) -> CallError {
    match tls_failure(e) {
        Some(why) => CallError::Fatal(ErrorCode::Unauthorized, format!("{addr}: {why}")),
        None => CallError::Lost(format!("{addr}: {}", io_text(e))),
    }
}

/// A client of a quire cluster.
pub struct Client {
    addrs: Vec<SocketAddr>,
    token: Vec<u8>,
    conns: BTreeMap<usize, Conn>,
    /// The node behind each address and the leader of each group, as
    /// learned so far; the retry policy reads and updates it.
    leaders: Leaders,
    client_id: u64,
    next_seq: u64,
    /// How long one call keeps retrying before it gives up.
    pub deadline: Duration,
    tls: Option<Arc<ClientTls>>,
}

impl Client {
    /// A client of the cluster whose nodes listen on `addrs`, presenting
    /// `token`. Connects lazily; `client_id` should be unique per client
    /// (a random one is fine).
    pub fn new(addrs: Vec<SocketAddr>, token: &[u8], client_id: u64) -> Client {
        Client {
            leaders: Leaders::new(addrs.len()),
            addrs,
            token: token.to_vec(),
            conns: BTreeMap::new(),
            client_id,
            next_seq: 1,
            deadline: Duration::from_secs(10),
            tls: None,
        }
    }

    /// The same client speaking TLS with `tls` to every node.
    pub fn with_tls(mut self, tls: Arc<ClientTls>) -> Client {
        self.conns.clear();
        self.tls = Some(tls);
        self
    }

    /// The TLS config it speaks with, if any.
    pub fn tls(&self) -> Option<&Arc<ClientTls>> {
        self.tls.as_ref()
    }

    fn connect(&mut self, i: usize) -> Result<(), CallError> {
        if self.conns.contains_key(&i) {
            return Ok(());
        }
        let addr = self.addrs[i];
        let lost = |e: std::io::Error| CallError::Lost(format!("{addr}: {}", io_text(&e)));
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).map_err(lost)?;
        let _ = stream.set_nodelay(true);
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(lost)?;
        // Bounded like the reads: a node that takes our bytes slowly
        // (or not at all) costs a call its timeout, not forever.
        stream
            .set_write_timeout(Some(Duration::from_secs(2)))
            .map_err(lost)?;
        let stream = match &self.tls {
            None => Stream::Plain(stream),
            Some(tls) => {
                let conn = tls.connect(addr).map_err(|e| {
                    CallError::Fatal(ErrorCode::Unauthorized, format!("{addr}: TLS: {e}"))
                })?;
                Stream::Tls(Box::new(rustls::StreamOwned::new(conn, stream)))
            }
        };
        let plain = matches!(stream, Stream::Plain(_));
        let mut conn = Conn {
            stream,
            session: ClientSession::new(ClientConfig::new(&self.token)),
            node: 0,
        };
        let (_, frame) = conn
            .session
            .hello()
            .map_err(|e| CallError::Lost(format!("{e:?}")))?;
        conn.stream
            .write_all(&frame)
            .map_err(|e| io_failure(addr, &e))?;
        let answer = if plain {
            read_hello_answer_plain(&mut conn, addr)
        } else {
            read_answer(&mut conn, addr)
        };
        match answer? {
            Response::HelloOk { node } => conn.node = node,
            Response::Error { code, message, .. } => {
                return Err(CallError::refused(code, format!("{addr}: {message}")))
            }
            other => {
                return Err(CallError::Lost(format!(
                    "unexpected answer to Hello: {other:?}"
                )))
            }
        }
        self.leaders.connected(i, conn.node);
        self.conns.insert(i, conn);
        Ok(())
    }

    /// Sends `req` to address `i` and waits for its answer; a broken
    /// connection is dropped (and reopened on the next call).
    fn call(&mut self, i: usize, req: &Request) -> Result<Response, CallError> {
        self.connect(i)?;
        let addr = self.addrs[i];
        let conn = self.conns.get_mut(&i).expect("just connected");
        let r = (|| {
            let (_, frame) = conn
                .session
                .request(req)
                .map_err(|e| CallError::Lost(format!("{e:?}")))?;
            conn.stream
                .write_all(&frame)
                .map_err(|e| io_failure(addr, &e))?;
            read_answer(conn, addr)
        })();
        if r.is_err() {
            self.conns.remove(&i);
        }
        r
    }

    /// Runs `req` against `group`'s leader, following redirects and
    /// retrying other nodes until `deadline`.
    fn with_leader(&mut self, group: u32, req: Request) -> Result<Response, ClientError> {
        let timeout_ms = self.deadline_ms();
        self.run(Attempts::new(group, req, 0, timeout_ms), Ok)
    }

    /// `deadline` in ms, the unit of the retry policy.
    fn deadline_ms(&self) -> u64 {
        u64::try_from(self.deadline.as_millis()).unwrap_or(u64::MAX)
    }

    /// Carries out `call`, started at time 0 of its own clock, to its end:
    /// the policy is [`Attempts`]'; this shell only sends, sleeps and
    /// reads the clock. `check` sees each answer before the policy does
    /// and may turn it into a lost try.
    fn run(
        &mut self,
        mut call: Attempts,
        check: impl Fn(Response) -> Result<Response, CallError>,
    ) -> Result<Response, ClientError> {
        let started = Instant::now();
        let now_ms = || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let mut verdict = call.next(0, &self.leaders);
        loop {
            verdict = match verdict {
                Verdict::Send(i) => {
                    let r = self.call(i, call.request()).and_then(&check);
                    call.answered(now_ms(), &mut self.leaders, i, r)
                }
                Verdict::RetryAfter { ms } => {
                    std::thread::sleep(Duration::from_millis(ms));
                    call.next(now_ms(), &self.leaders)
                }
                Verdict::Done(resp) => return Ok(resp),
                Verdict::Fail(e) => return Err(e),
            };
        }
    }

    /// Appends `data` to `group`'s log; returns its index once it is
    /// durable on a majority and applied. Retries (other nodes, after a
    /// failover) reuse the same sequence number, so it is applied once.
    pub fn append(&mut self, group: u32, data: &[u8]) -> Result<u64, ClientError> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let req = Request::Append {
            group,
            client_id: self.client_id,
            seq,
            data: bytes::Bytes::copy_from_slice(data),
        };
        match self.with_leader(group, req)? {
            Response::Appended { index } => Ok(index),
            other => Err(ClientError::Unavailable(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }

    /// Appends every record of `records` to `group` and returns their
    /// indexes, in order, through a [`Producer`] of this client's id and
    /// seqs: up to `in_flight` requests outstanding on the leader's
    /// connection, each carrying up to `batch_max` records (one
    /// `AppendBatch`; records gather into batches only while the
    /// connection is full, the producer's `linger_us` is 0). A request
    /// that fails (a failover, a lost connection) is retried record by
    /// record with the same sequence numbers, so nothing is applied twice.
    /// At the first record that fails for good no more are sent, and its
    /// error is returned once those already sent have their outcome.
    pub fn append_all(
        &mut self,
        group: u32,
        records: &[Vec<u8>],
        in_flight: usize,
        batch_max: usize,
    ) -> Result<Vec<u64>, ClientError> {
        let config = ProducerConfig {
            in_flight_max: in_flight.max(1),
            batch_records_max: batch_max.clamp(1, crate::api::wire::ITEMS_MAX),
            deadline_ms: self.deadline_ms(),
            ..ProducerConfig::default()
        };
        let mut p = Producer::with_leaders(
            self.addrs.clone(),
            &self.token,
            self.client_id,
            config,
            self.leaders.clone(),
        );
        if let Some(tls) = &self.tls {
            p = p.with_tls(Arc::clone(tls));
        }
        p.set_next_seq(group, self.next_seq);
        self.next_seq += records.len() as u64;
        let mut indexes = vec![0u64; records.len()];
        let mut first_error: Option<ClientError> = None;
        // A fresh producer: ticket k is records[k - 1].
        let mut take = |c: Completion, first_error: &mut Option<ClientError>| match c.result {
            Ok(index) => indexes[(c.ticket.number() - 1) as usize] = index,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        };
        'records: for r in records {
            loop {
                match p.send(group, r) {
                    Ok(_) => break,
                    Err(SendError::Full) => {
                        if let Some(c) = p.poll(Duration::from_millis(50)) {
                            take(c, &mut first_error);
                        }
                    }
                    Err(e @ SendError::TooLarge { .. }) => {
                        first_error.get_or_insert(ClientError::Refused(
                            ErrorCode::TooLarge,
                            e.to_string(),
                        ));
                        break 'records;
                    }
                }
            }
            if first_error.is_some() {
                break;
            }
        }
        for c in p.flush() {
            take(c, &mut first_error);
        }
        self.leaders = p.leaders().clone();
        match first_error {
            Some(e) => Err(e),
            None => Ok(indexes),
        }
    }

    /// Committed entries of `group` from index `from`, at most
    /// `max_entries`, read linearizably from the group's leader (after a
    /// read-index round there): every append confirmed before the call,
    /// by any client, is in the answer.
    pub fn read(
        &mut self,
        group: u32,
        from: u64,
        max_entries: u32,
    ) -> Result<Vec<Entry>, ClientError> {
        self.entries_from_leader(group, log_read(group, from, max_entries, false))
    }

    /// Committed entries of `group` from `from` on, waiting up to `wait_ms`
    /// on the leader for the first one to commit (a long poll; empty if
    /// none did).
    pub fn tail(&mut self, group: u32, from: u64, wait_ms: u32) -> Result<Vec<Entry>, ClientError> {
        self.entries_from_leader(group, log_tail(group, from, wait_ms, false))
    }

    /// Committed entries of `group` from `from` as the first node that
    /// answers has applied them, leader or not (a stale read): it may miss
    /// entries committed but not yet applied on that node.
    pub fn read_stale(
        &mut self,
        group: u32,
        from: u64,
        max_entries: u32,
    ) -> Result<Vec<Entry>, ClientError> {
        self.entries_from_any_node(log_read(group, from, max_entries, true))
    }

    /// Committed entries of `group` from `from` on as the first node that
    /// answers has applied them, leader or not, waiting up to `wait_ms`
    /// there for the first one (a stale long poll): it answers only once
    /// that node has applied an entry, so it may lag behind the leader,
    /// and a node cut off from the leader answers empty until it heals.
    /// Entries come in log order from `from`, none skipped: what a node
    /// has applied is committed.
    pub fn tail_stale(
        &mut self,
        group: u32,
        from: u64,
        wait_ms: u32,
    ) -> Result<Vec<Entry>, ClientError> {
        self.entries_from_any_node(log_tail(group, from, wait_ms, true))
    }

    /// Committed entries of `group` from `from` as node `addrs[i]` has
    /// applied them, leader or not: a stale read of that node's copy (it
    /// may miss entries committed but not yet applied there).
    pub fn read_from(
        &mut self,
        i: usize,
        group: u32,
        from: u64,
        max_entries: u32,
    ) -> Result<Vec<Entry>, ClientError> {
        self.entries_from(i, &log_read(group, from, max_entries, true))
    }

    /// The entries `group`'s leader answers the read or tail `req` with.
    fn entries_from_leader(&mut self, group: u32, req: Request) -> Result<Vec<Entry>, ClientError> {
        match self.with_leader(group, req)? {
            Response::Entries { entries } => Ok(entries),
            other => Err(ClientError::Unavailable(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }

    /// Sends the stale read or tail `req` to each address in turn, from
    /// the first, until one answers with entries or a refusal that is not
    /// `Unavailable` or `Timeout`, or `deadline` passes. A node that
    /// answers with anything but entries counts as a lost try.
    fn entries_from_any_node(&mut self, req: Request) -> Result<Vec<Entry>, ClientError> {
        let timeout_ms = self.deadline_ms();
        let entries_or_error = |resp| match resp {
            Response::Entries { .. } | Response::Error { .. } => Ok(resp),
            other => Err(CallError::Lost(format!("unexpected answer {other:?}"))),
        };
        match self.run(Attempts::any_node(req, 0, timeout_ms), entries_or_error)? {
            Response::Entries { entries } => Ok(entries),
            other => Err(ClientError::Unavailable(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }

    /// The entries node `addrs[i]` answers the read or tail `req` with.
    fn entries_from(&mut self, i: usize, req: &Request) -> Result<Vec<Entry>, ClientError> {
        match self.call(i, req) {
            Ok(Response::Entries { entries }) => Ok(entries),
            Ok(Response::Error { code, message, .. }) => Err(ClientError::Refused(code, message)),
            Ok(other) => Err(ClientError::Unavailable(format!(
                "unexpected answer {other:?}"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// What this client learnt of the cluster's leaders so far.
    pub(crate) fn known_leaders(&self) -> &Leaders {
        &self.leaders
    }

    /// Which node leads each group, as node `addrs[i]` sees it.
    pub fn leaders(&mut self, i: usize) -> Result<Vec<LeaderInfo>, ClientError> {
        match self.call(i, &Request::Leaders) {
            Ok(Response::LeaderMap { groups }) => Ok(groups),
            Ok(other) => Err(ClientError::Unavailable(format!(
                "unexpected answer {other:?}"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Node `addrs[i]`'s status as JSON.
    pub fn status(&mut self, i: usize) -> Result<String, ClientError> {
        match self.call(i, &Request::Status) {
            Ok(Response::StatusJson { json }) => Ok(json),
            Ok(other) => Err(ClientError::Unavailable(format!(
                "unexpected answer {other:?}"
            ))),
            Err(e) => Err(e.into()),
        }
    }
}

/// Most data bytes a read asks for: 16 MiB, the default bound of a whole
/// frame (`api::FRAME_BYTES_MAX`).
const READ_BYTES_MAX: u32 = 16 << 20;

/// A Read of `group`'s log from `from`, at most `max_entries`.
fn log_read(group: u32, from: u64, max_entries: u32, stale: bool) -> Request {
    Request::Read {
        group,
        from,
        max_entries,
        max_bytes: READ_BYTES_MAX,
        stale,
    }
}

/// A Tail of `group`'s log from `from`, waiting up to `wait_ms`.
fn log_tail(group: u32, from: u64, wait_ms: u32, stale: bool) -> Request {
    Request::Tail {
        group,
        from,
        wait_ms,
        stale,
    }
}

/// Reads from the connection until the session yields an answer, with its
/// request id.
fn read_reply(conn: &mut Conn, addr: SocketAddr) -> Result<(u64, Response), CallError> {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match conn.session.poll() {
            Ok(Some(Received::Response { id, resp })) => return Ok((id, resp)),
            Ok(Some(Received::ConnectionError { code, message })) => {
                return Err(CallError::refused(
                    code,
                    format!("connection refused: {message}"),
                ))
            }
            Ok(None) => {}
            Err(e) => return Err(CallError::Lost(format!("protocol error: {e:?}"))),
        }
        let n = conn
            .stream
            .read(&mut buf)
            .map_err(|e| io_failure(addr, &e))?;
        if n == 0 {
            return Err(CallError::Lost("connection closed".into()));
        }
        push_all(conn, &buf[..n])?;
    }
}

/// Hands `bytes` to the connection's session, all of them.
fn push_all(conn: &mut Conn, bytes: &[u8]) -> Result<(), CallError> {
    let mut at = 0;
    while at < bytes.len() {
        let took = conn.session.push(&bytes[at..]);
        at += took;
        if took == 0 {
            return Err(CallError::Lost(
                "the answer does not fit the session's buffer".into(),
            ));
        }
    }
    Ok(())
}

/// The answer to a Hello sent over plain TCP: a node that serves TLS
/// answers it with a TLS alert, which is said as such (and is for good)
/// rather than read as a frame that never completes.
fn read_hello_answer_plain(conn: &mut Conn, addr: SocketAddr) -> Result<Response, CallError> {
    let mut first = [0u8; 2];
    let mut got = 0;
    while got < first.len() {
        match conn.stream.read(&mut first[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_failure(addr, &e)),
        }
    }
    if looks_like_tls(&first[..got]) {
        return Err(CallError::Fatal(
            ErrorCode::Unauthorized,
            format!("{addr}: the node serves TLS: give the CA that signed its certificate (--ca)"),
        ));
    }
    push_all(conn, &first[..got])?;
    read_answer(conn, addr)
}

/// An I/O error as an operator reads it: a read that hit the socket's
/// timeout says so (not "Resource temporarily unavailable (os error 11)").
fn io_text(e: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => "timed out".into(),
        ErrorKind::ConnectionRefused => "connection refused".into(),
        ErrorKind::ConnectionReset => "connection reset".into(),
        _ => e.to_string(),
    }
}

/// Reads from the connection until the session yields an answer.
fn read_answer(conn: &mut Conn, addr: SocketAddr) -> Result<Response, CallError> {
    read_reply(conn, addr).map(|(_, resp)| resp)
}
