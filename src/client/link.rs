//! One non-blocking connection of a [`Producer`](super::Producer) to one
//! node: the socket, its `ClientSession`, the bytes waiting to be written
//! and which producer call each request in flight belongs to.
//!
//! It owns the bytes of one socket and nothing else: it never decides
//! what to send or what an answer means (the producer and the retry
//! policy do), and it never blocks but in [`Link::open`] (a TCP connect,
//! bounded by its timeout). Requests are encoded into one output buffer
//! and written together: one `write` per turn per connection, however
//! many requests the turn queued. Over TLS the frames go through a
//! `tls::TlsChannel` (rustls driven by hand: the handshake runs in the
//! same non-blocking turns as the requests behind it).

use super::retry::CallError;
use super::{io_failure, io_text};
use crate::api::{ClientConfig, ClientSession, ErrorCode, Received, Request, RequestError};
use crate::tls::{ClientTls, TlsChannel};
use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// Most bytes read from one socket in one turn: the other connections
/// (and the caller) get their turn too.
const READ_BYTES_PER_TURN_MAX: usize = 1 << 20;

/// A producer call's id (the producer's key for it).
pub(crate) type CallId = u64;

/// One open connection.
pub(crate) struct Link {
    stream: TcpStream,
    /// The TLS session the frames go through, if the producer has TLS.
    tls: Option<Box<TlsChannel>>,
    addr: SocketAddr,
    session: ClientSession,
    /// Frames encoded and not yet written: `out[out_at..]`.
    out: Vec<u8>,
    out_at: usize,
    /// The Hello's request id: its answer says which node this is.
    pub(crate) hello_id: u64,
    /// Request id -> the call it carries.
    pub(crate) waiting: HashMap<u64, CallId>,
    /// Calls told to go here while `in_flight_max` requests were waiting:
    /// sent, oldest first, as answers free slots.
    pub(crate) backlog: VecDeque<CallId>,
    /// The last time bytes arrived, or a request went out on an idle
    /// connection: a connection with requests waiting that hears nothing
    /// for the request timeout is given up (as a read timeout would).
    pub(crate) heard: Instant,
}

impl Link {
    /// Connects to `addr` (blocking, at most `connect_timeout`) and queues
    /// the Hello; requests may be queued behind it at once.
    pub(crate) fn open(
        addr: SocketAddr,
        token: &[u8],
        in_flight_max: usize,
        connect_timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<Link, CallError> {
        let lost = |e: std::io::Error| CallError::Lost(format!("{addr}: {}", io_text(&e)));
        let stream = TcpStream::connect_timeout(&addr, connect_timeout).map_err(lost)?;
        let _ = stream.set_nodelay(true);
        stream.set_nonblocking(true).map_err(lost)?;
        let tls = match tls {
            None => None,
            Some(t) => {
                let conn = t.connect(addr).map_err(|e| {
                    CallError::Fatal(ErrorCode::Unauthorized, format!("{addr}: TLS: {e}"))
                })?;
                Some(Box::new(TlsChannel::new(conn)))
            }
        };
        let mut config = ClientConfig::new(token);
        // The Hello is in flight too until its answer comes.
        config.in_flight_max = in_flight_max + 1;
        let mut session = ClientSession::new(config);
        let (hello_id, frame) = session
            .hello()
            .map_err(|e| CallError::Lost(format!("{addr}: {e}")))?;
        Ok(Link {
            stream,
            tls,
            addr,
            session,
            out: frame,
            out_at: 0,
            hello_id,
            waiting: HashMap::new(),
            backlog: VecDeque::new(),
            heard: Instant::now(),
        })
    }

    /// Requests waiting for answers plus calls waiting for a slot.
    pub(crate) fn load(&self) -> usize {
        self.waiting.len() + self.backlog.len()
    }

    /// Encodes `req` for call `call` into the output buffer.
    pub(crate) fn queue(&mut self, call: CallId, req: &Request) -> Result<(), RequestError> {
        let (id, frame) = self.session.request(req)?;
        if self.waiting.is_empty() {
            self.heard = Instant::now();
        }
        self.waiting.insert(id, call);
        self.out.extend_from_slice(&frame);
        Ok(())
    }

    /// True while encoded bytes (or TLS records) wait to be written and
    /// can be: mid-handshake, frames wait for the keys, not for room in
    /// the socket (asking `poll` for POLLOUT then would spin).
    pub(crate) fn wants_write(&self) -> bool {
        let frames = self.out_at < self.out.len();
        match &self.tls {
            None => frames,
            Some(t) => t.wants_write() || (frames && !t.is_handshaking()),
        }
    }

    /// Writes what the socket takes now, without blocking.
    pub(crate) fn write(&mut self) -> Result<(), CallError> {
        if let Some(tls) = &mut self.tls {
            match tls.write_from(&mut self.stream, &self.out, &mut self.out_at) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(io_failure(self.addr, &e)),
            }
        }
        while self.out_at < self.out.len() && self.tls.is_none() {
            match self.stream.write(&self.out[self.out_at..]) {
                Ok(0) => return Err(CallError::Lost("connection closed".into())),
                Ok(n) => self.out_at += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(CallError::Lost(io_text(&e))),
            }
        }
        if self.out_at == self.out.len() {
            self.out.clear();
            self.out_at = 0;
        }
        Ok(())
    }

    /// Reads what the socket has now, without blocking, and appends every
    /// answer it completes to `got`. `buf` is the caller's scratch space.
    pub(crate) fn read(
        &mut self,
        buf: &mut [u8],
        got: &mut Vec<Received>,
    ) -> Result<(), CallError> {
        let mut read = 0;
        while read < READ_BYTES_PER_TURN_MAX {
            let r = match &mut self.tls {
                None => self.stream.read(buf),
                Some(tls) => tls.read(&mut self.stream, buf),
            };
            let n = match r {
                Ok(0) => return Err(CallError::Lost("connection closed".into())),
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_failure(self.addr, &e)),
            };
            let first = self.session.stats().bytes_received == 0;
            if first && self.tls.is_none() && crate::tls::looks_like_tls(&buf[..n]) {
                return Err(CallError::Fatal(
                    ErrorCode::Unauthorized,
                    format!(
                        "{}: the node serves TLS: give the CA that signed its certificate (--ca)",
                        self.addr
                    ),
                ));
            }
            read += n;
            self.heard = Instant::now();
            let mut at = 0;
            while at < n {
                let took = self.session.push(&buf[at..n]);
                at += took;
                self.answers(got)?;
                if took == 0 && at < n {
                    return Err(CallError::Lost(
                        "the answer does not fit the session's buffer".into(),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Moves every complete answer out of the session into `got`.
    fn answers(&mut self, got: &mut Vec<Received>) -> Result<(), CallError> {
        loop {
            match self.session.poll() {
                Ok(Some(r)) => got.push(r),
                Ok(None) => return Ok(()),
                Err(e) => return Err(CallError::Lost(format!("protocol error: {e}"))),
            }
        }
    }

    /// The socket, for `poll(2)`.
    pub(crate) fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// The socket, borrowed, for a safe `poll(2)`.
    pub(crate) fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.stream.as_fd()
    }
}
