//! The two ends of one client connection as state machines: bytes in,
//! requests or responses out, frames to write back. No sockets, no clock.
//!
//! The caller's loop, for either end:
//!
//! ```text
//! read bytes from the socket
//! while bytes are left:  n = session.push(bytes); bytes = bytes[n..]
//!                        while let Some(item) = session.poll()? { serve it }
//! on Err(e) (server):    write session.close_frame(), then close the socket
//! ```
//!
//! Every error here is fatal to its connection and to nothing else: after
//! a malformed frame the byte stream cannot be trusted to be in sync, so
//! the server answers once with an Error frame and closes. Each session
//! keeps its counters; the daemon adds them up ([`SessionStats::merge`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use super::framer::Framer;
use super::wire::{
    decode_response, encode_request, encode_response, DecodeError, EncodeError, ErrorCode,
    FrameHeader, Request, Response, FRAME_BYTES_LIMIT, FRAME_BYTES_MAX, FRAME_BYTES_MIN,
    HELLO_FRAME_BYTES_MAX, LEN_BYTES, OP_HELLO, TOKEN_BYTES_MAX, VERSION,
};
use crate::consensus::NodeId;

/// Smallest `frame_bytes_max` a session accepts: room for any fixed-size
/// message and a useful error message.
pub const SESSION_FRAME_BYTES_MIN: usize = 1024;
/// Default bound on requests handed out and not yet answered, per connection.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 1024;

/// Why a connection is being closed. Fatal: the session accepts nothing
/// more, and (on the server) [`ServerSession::close_frame`] says why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// A frame did not decode.
    Decode(DecodeError),
    /// A request came before a successful Hello.
    HelloRequired {
        /// Its opcode.
        opcode: u8,
    },
    /// The Hello's token is wrong.
    BadToken,
    /// The Hello asks for a protocol version this node does not speak.
    HelloVersion(u8),
    /// A second Hello on an authenticated connection.
    HelloTwice,
    /// A response to no request in flight, or of the wrong kind (client side).
    UnexpectedResponse {
        /// The response's id.
        id: u64,
    },
}

impl ProtocolError {
    /// The error code the server sends for it.
    pub fn code(&self) -> ErrorCode {
        match self {
            ProtocolError::Decode(DecodeError::Oversize { .. }) => ErrorCode::TooLarge,
            ProtocolError::Decode(DecodeError::UnsupportedVersion(_))
            | ProtocolError::HelloVersion(_) => ErrorCode::UnsupportedVersion,
            ProtocolError::HelloRequired { .. } | ProtocolError::BadToken => {
                ErrorCode::Unauthorized
            }
            ProtocolError::Decode(_)
            | ProtocolError::HelloTwice
            | ProtocolError::UnexpectedResponse { .. } => ErrorCode::BadRequest,
        }
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::Decode(e) => write!(f, "malformed frame: {e}"),
            ProtocolError::HelloRequired { opcode } => {
                write!(f, "request {opcode:#04x} before a successful Hello")
            }
            ProtocolError::BadToken => f.write_str("wrong auth token"),
            ProtocolError::HelloVersion(v) => {
                write!(f, "Hello asks for version {v}; this node speaks {VERSION}")
            }
            ProtocolError::HelloTwice => f.write_str("Hello on an authenticated connection"),
            ProtocolError::UnexpectedResponse { id } => {
                write!(f, "response {id} answers no request in flight")
            }
        }
    }
}

impl std::error::Error for ProtocolError {}

/// Counters of one connection; names say what they count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Whole frames received (valid or not).
    pub frames_received: u64,
    /// Bytes accepted by `push`.
    pub bytes_received: u64,
    /// Frames produced for the peer.
    pub frames_sent: u64,
    /// Bytes of those frames.
    pub bytes_sent: u64,
    /// Bytes pushed after the connection failed, thrown away.
    pub bytes_discarded: u64,
    /// Responses too large to send, replaced by a TooLarge error.
    pub responses_too_large: u64,
    /// Closed: a length prefix above `frame_bytes_max`.
    pub errors_oversize: u64,
    /// Closed: a length prefix below a header.
    pub errors_bad_length: u64,
    /// Closed: a frame or Hello of another protocol version.
    pub errors_unsupported_version: u64,
    /// Closed: an unknown opcode.
    pub errors_unknown_opcode: u64,
    /// Closed: a frame ending before its fields.
    pub errors_truncated: u64,
    /// Closed: bytes after a message's last field.
    pub errors_trailing_bytes: u64,
    /// Closed: a bad string, tag, error code or list count.
    pub errors_malformed: u64,
    /// Closed: a request before Hello.
    pub errors_hello_required: u64,
    /// Closed: a second Hello.
    pub errors_hello_twice: u64,
    /// Closed: a response matching no request (client side).
    pub errors_unexpected_response: u64,
    /// Closed: a Hello with a wrong token.
    pub auth_failures: u64,
}

impl SessionStats {
    /// Connections closed for any protocol error, auth failures included.
    pub fn protocol_errors(&self) -> u64 {
        self.errors_oversize
            + self.errors_bad_length
            + self.errors_unsupported_version
            + self.errors_unknown_opcode
            + self.errors_truncated
            + self.errors_trailing_bytes
            + self.errors_malformed
            + self.errors_hello_required
            + self.errors_hello_twice
            + self.errors_unexpected_response
            + self.auth_failures
    }

    /// Adds `other` into `self`: the daemon's totals over connections.
    pub fn merge(&mut self, other: &SessionStats) {
        let SessionStats {
            frames_received,
            bytes_received,
            frames_sent,
            bytes_sent,
            bytes_discarded,
            responses_too_large,
            errors_oversize,
            errors_bad_length,
            errors_unsupported_version,
            errors_unknown_opcode,
            errors_truncated,
            errors_trailing_bytes,
            errors_malformed,
            errors_hello_required,
            errors_hello_twice,
            errors_unexpected_response,
            auth_failures,
        } = *other;
        self.frames_received += frames_received;
        self.bytes_received += bytes_received;
        self.frames_sent += frames_sent;
        self.bytes_sent += bytes_sent;
        self.bytes_discarded += bytes_discarded;
        self.responses_too_large += responses_too_large;
        self.errors_oversize += errors_oversize;
        self.errors_bad_length += errors_bad_length;
        self.errors_unsupported_version += errors_unsupported_version;
        self.errors_unknown_opcode += errors_unknown_opcode;
        self.errors_truncated += errors_truncated;
        self.errors_trailing_bytes += errors_trailing_bytes;
        self.errors_malformed += errors_malformed;
        self.errors_hello_required += errors_hello_required;
        self.errors_hello_twice += errors_hello_twice;
        self.errors_unexpected_response += errors_unexpected_response;
        self.auth_failures += auth_failures;
    }

    fn count_error(&mut self, e: &ProtocolError) {
        let c = match e {
            ProtocolError::Decode(d) => match d {
                DecodeError::Oversize { .. } => &mut self.errors_oversize,
                DecodeError::BadLength { .. } => &mut self.errors_bad_length,
                DecodeError::UnsupportedVersion(_) => &mut self.errors_unsupported_version,
                DecodeError::UnknownOpcode(_) => &mut self.errors_unknown_opcode,
                DecodeError::Truncated => &mut self.errors_truncated,
                DecodeError::TrailingBytes { .. } => &mut self.errors_trailing_bytes,
                DecodeError::BadUtf8 | DecodeError::Invalid(_) => &mut self.errors_malformed,
            },
            ProtocolError::HelloRequired { .. } => &mut self.errors_hello_required,
            ProtocolError::BadToken => &mut self.auth_failures,
            ProtocolError::HelloVersion(_) => &mut self.errors_unsupported_version,
            ProtocolError::HelloTwice => &mut self.errors_hello_twice,
            ProtocolError::UnexpectedResponse { .. } => &mut self.errors_unexpected_response,
        };
        *c += 1;
    }
}

fn check_frame_bytes_max(frame_bytes_max: usize) {
    assert!(
        (SESSION_FRAME_BYTES_MIN..=FRAME_BYTES_LIMIT).contains(&frame_bytes_max),
        "frame_bytes_max {frame_bytes_max} outside {SESSION_FRAME_BYTES_MIN}..={FRAME_BYTES_LIMIT}"
    );
}

/// What every server connection shares: who we are and the token to expect.
#[derive(Clone)]
pub struct ServerConfig {
    /// This node's id, sent in HelloOk.
    pub node: NodeId,
    /// Largest frame accepted or sent, prefix included.
    pub frame_bytes_max: usize,
    /// Requests handed out by `poll` and not yet answered before `poll`
    /// stops handing out more (the rest wait in the buffer, then in TCP).
    pub requests_in_flight_max: usize,
    /// BLAKE3 of each token accepted, and the principal (an index the
    /// caller gives meaning to) it authenticates: a lookup of the fixed-
    /// size hash reveals nothing of a token's bytes or length.
    tokens: BTreeMap<[u8; 32], u32>,
}

impl fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the token or its hash.
        f.debug_struct("ServerConfig")
            .field("node", &self.node)
            .field("frame_bytes_max", &self.frame_bytes_max)
            .field("requests_in_flight_max", &self.requests_in_flight_max)
            .finish_non_exhaustive()
    }
}

impl ServerConfig {
    /// A config for node `node` expecting `token` (principal 0), with
    /// default limits.
    pub fn new(node: NodeId, token: &[u8]) -> ServerConfig {
        Self::with_tokens(node, [(*blake3::hash(token).as_bytes(), 0)])
    }

    /// A config accepting each of `tokens`, given as the BLAKE3 of the
    /// token and the principal it authenticates.
    pub fn with_tokens(
        node: NodeId,
        tokens: impl IntoIterator<Item = ([u8; 32], u32)>,
    ) -> ServerConfig {
        ServerConfig {
            node,
            frame_bytes_max: FRAME_BYTES_MAX,
            requests_in_flight_max: REQUESTS_IN_FLIGHT_MAX,
            tokens: tokens.into_iter().collect(),
        }
    }

    fn principal_of(&self, token: &[u8]) -> Option<u32> {
        self.tokens.get(blake3::hash(token).as_bytes()).copied()
    }
}

/// What the server gets out of its session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Incoming {
    /// The Hello was accepted; write `reply` (its HelloOk frame).
    Handshake {
        /// The Hello's id.
        id: u64,
        /// The encoded HelloOk.
        reply: Vec<u8>,
    },
    /// A request to serve; answer it with [`ServerSession::respond`].
    Request {
        /// Its id, to pass back to `respond`.
        id: u64,
        /// The request (never a Hello).
        req: Request,
    },
}

/// The server end of one client connection.
#[derive(Debug)]
pub struct ServerSession {
    config: Arc<ServerConfig>,
    framer: Framer,
    authenticated: bool,
    in_flight: usize,
    /// The fatal error and the id of the frame that caused it (0 if unknown).
    failed: Option<(u64, ProtocolError)>,
    stats: SessionStats,
    /// Who the connection is (see [`principal`](Self::principal)).
    principal: Option<u32>,
}

impl ServerSession {
    /// A session for a newly accepted connection.
    pub fn new(config: Arc<ServerConfig>) -> ServerSession {
        check_frame_bytes_max(config.frame_bytes_max);
        assert!(
            config.requests_in_flight_max > 0,
            "requests_in_flight_max is 0"
        );
        // Until the Hello succeeds, hold no more than a Hello: an
        // unauthenticated peer costs at most HELLO_FRAME_BYTES_MAX.
        let pre_auth_bytes_max = config.frame_bytes_max.min(HELLO_FRAME_BYTES_MAX);
        ServerSession {
            framer: Framer::new(config.frame_bytes_max, pre_auth_bytes_max),
            config,
            authenticated: false,
            in_flight: 0,
            failed: None,
            stats: SessionStats::default(),
            principal: None,
        }
    }

    /// Takes bytes read from the socket; returns how many it took. Call
    /// [`poll`](Self::poll) until it yields nothing, then push the rest.
    /// After a fatal error it takes (and discards) everything.
    pub fn push(&mut self, bytes: &[u8]) -> usize {
        if self.failed.is_some() {
            self.stats.bytes_discarded += bytes.len() as u64;
            return bytes.len();
        }
        let n = self.framer.push(bytes);
        self.stats.bytes_received += n as u64;
        // Check the next frame's header now, not when the frame is complete:
        // a bad one closes the connection before we buffer any more of it.
        if let Err((id, e)) = self.check_head() {
            self.fail(id, e);
        }
        n
    }

    /// Bytes [`read_from`](Self::read_from) may still take: 0 while a
    /// whole frame waits to be handed out by [`poll`](Self::poll).
    pub fn room_bytes(&self) -> usize {
        if self.failed.is_some() {
            return 0;
        }
        self.framer.room()
    }

    /// [`push`](Self::push) for a socket: reads at most `want` bytes of
    /// `fd` straight into the receive buffer (no copy on the way); `Ok(0)`
    /// is the end of the stream. Without [`room_bytes`](Self::room_bytes)
    /// (or after a fatal error) it reads nothing and says `WouldBlock`.
    pub fn read_from(
        &mut self,
        fd: std::os::fd::BorrowedFd<'_>,
        want: usize,
    ) -> std::io::Result<usize> {
        if self.failed.is_some() {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        let n = self.framer.read_from(fd, want)?;
        self.stats.bytes_received += n as u64;
        if let Err((id, e)) = self.check_head() {
            self.fail(id, e);
        }
        Ok(n)
    }

    /// Judges the next frame from its first bytes: its length, and before
    /// authentication that it is a Hello small enough to be one (so that
    /// a frame the pre-auth buffer cannot hold never waits to complete).
    fn check_head(&self) -> Result<(), (u64, ProtocolError)> {
        self.framer.check_head().map_err(|e| (0, e.into()))?;
        if self.authenticated {
            return Ok(());
        }
        let Some(h) = self.framer.head().get(..FRAME_BYTES_MIN) else {
            return Ok(());
        };
        let le = |b: &[u8]| b.iter().rev().fold(0u64, |v, &x| v << 8 | u64::from(x));
        let frame_bytes = LEN_BYTES as u64 + le(&h[..LEN_BYTES]);
        let (version, opcode, id) = (h[4], h[5], le(&h[6..14]));
        if version != VERSION {
            return Err((id, DecodeError::UnsupportedVersion(version).into()));
        }
        if opcode != OP_HELLO {
            return Err((id, ProtocolError::HelloRequired { opcode }));
        }
        let frame_bytes_max = self.config.frame_bytes_max.min(HELLO_FRAME_BYTES_MAX);
        if frame_bytes > frame_bytes_max as u64 {
            let e = DecodeError::Oversize {
                frame_bytes,
                frame_bytes_max,
            };
            return Err((id, e.into()));
        }
        Ok(())
    }

    /// The next request, `Ok(None)` if none is complete (or too many are
    /// unanswered), or the fatal error: write [`close_frame`](Self::close_frame)
    /// and close. Returns the same error again if called after one.
    pub fn poll(&mut self) -> Result<Option<Incoming>, ProtocolError> {
        if let Some((_, e)) = &self.failed {
            return Err(e.clone());
        }
        if self.in_flight >= self.config.requests_in_flight_max {
            return Ok(None);
        }
        if let Err((id, e)) = self.check_head() {
            return Err(self.fail(id, e));
        }
        let frame = match self.framer.next_frame() {
            Ok(Some(frame)) => frame,
            Ok(None) => return Ok(None),
            Err(e) => return Err(self.fail(0, ProtocolError::Decode(e))),
        };
        self.stats.frames_received += 1;
        let (header, payload) = match FrameHeader::split(&frame, self.config.frame_bytes_max) {
            Ok((header, payload)) => (header, frame.slice_ref(payload)),
            Err(e) => return Err(self.fail(0, ProtocolError::Decode(e))),
        };
        let id = header.id;
        if header.version != VERSION {
            return Err(self.fail(id, DecodeError::UnsupportedVersion(header.version).into()));
        }
        let req = match Request::decode_shared(header.opcode, &payload) {
            Ok(req) => req,
            Err(e) => return Err(self.fail(id, e.into())),
        };
        match (self.authenticated, req) {
            (false, Request::Hello { version, token }) => {
                if version != VERSION {
                    return Err(self.fail(id, ProtocolError::HelloVersion(version)));
                }
                // A principal its client certificate proved needs no
                // token; anyone else's token must be known.
                let principal = match self.principal {
                    Some(p) => p,
                    None => match self.config.principal_of(&token) {
                        Some(p) => p,
                        None => return Err(self.fail(id, ProtocolError::BadToken)),
                    },
                };
                self.principal = Some(principal);
                self.authenticated = true;
                self.framer
                    .set_buffer_bytes_max(self.config.frame_bytes_max);
                let reply = self.encode(
                    id,
                    &Response::HelloOk {
                        node: self.config.node,
                    },
                );
                Ok(Some(Incoming::Handshake { id, reply }))
            }
            (false, req) => Err(self.fail(
                id,
                ProtocolError::HelloRequired {
                    opcode: req.opcode(),
                },
            )),
            (true, Request::Hello { .. }) => Err(self.fail(id, ProtocolError::HelloTwice)),
            (true, req) => {
                self.in_flight += 1;
                Ok(Some(Incoming::Request { id, req }))
            }
        }
    }

    /// Encodes the answer to request `id`. A response too large for the
    /// frame limit is replaced by a TooLarge error for the same id.
    pub fn respond(&mut self, id: u64, resp: &Response) -> Vec<u8> {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.encode(id, resp)
    }

    /// [`respond`](Self::respond), appending the frame to `out` (a
    /// connection's write buffer) rather than to a buffer of its own.
    pub fn respond_into(&mut self, id: u64, resp: &Response, out: &mut Vec<u8>) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.encode_into(id, resp, out);
    }

    /// The Error frame to write before closing after a fatal error; `None`
    /// while the connection is healthy. Its id is the offending frame's, or
    /// 0 if the frame was too broken to have one.
    pub fn close_frame(&mut self) -> Option<Vec<u8>> {
        let (id, e) = self.failed.clone()?;
        let resp = Response::Error {
            code: e.code(),
            message: e.to_string(),
            leader: None,
        };
        Some(self.encode(id, &resp))
    }

    /// The fatal error, if the connection has failed.
    pub fn error(&self) -> Option<&ProtocolError> {
        self.failed.as_ref().map(|(_, e)| e)
    }

    /// True once a Hello with the right version and token was accepted.
    pub fn is_authenticated(&self) -> bool {
        self.authenticated
    }

    /// The principal the connection is: its token's once the Hello is
    /// accepted, or the one [`certified`](Self::certified) named.
    pub fn principal(&self) -> Option<u32> {
        self.principal
    }

    /// Before the Hello: the connection's client certificate proved it is
    /// `principal`, so its Hello needs no known token.
    pub fn certified(&mut self, principal: u32) {
        if !self.authenticated {
            self.principal = Some(principal);
        }
    }

    /// Requests handed out by `poll` and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Bytes received and not yet decoded.
    pub fn buffered_bytes(&self) -> usize {
        self.framer.buffered()
    }

    /// Bytes allocated for the receive buffer: never above `frame_bytes_max`,
    /// nor above [`HELLO_FRAME_BYTES_MAX`] before the Hello succeeds.
    pub fn buffer_capacity(&self) -> usize {
        self.framer.capacity()
    }

    /// This connection's counters.
    pub fn stats(&self) -> &SessionStats {
        &self.stats
    }

    fn encode(&mut self, id: u64, resp: &Response) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(id, resp, &mut out);
        out
    }

    /// Appends the frame answering `id` to `out`.
    fn encode_into(&mut self, id: u64, resp: &Response, out: &mut Vec<u8>) {
        let start = out.len();
        if let Err(e) = encode_response(id, resp, self.config.frame_bytes_max, out) {
            out.truncate(start);
            self.stats.responses_too_large += 1;
            let err = Response::Error {
                code: ErrorCode::TooLarge,
                message: format!("response not sent: {e}"),
                leader: None,
            };
            encode_response(id, &err, self.config.frame_bytes_max, out)
                .expect("an error frame fits in SESSION_FRAME_BYTES_MIN");
        }
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += (out.len() - start) as u64;
    }

    fn fail(&mut self, id: u64, e: ProtocolError) -> ProtocolError {
        debug_assert!(self.failed.is_none());
        self.stats.count_error(&e);
        self.failed = Some((id, e.clone()));
        self.framer.clear();
        e
    }
}

impl From<DecodeError> for ProtocolError {
    fn from(e: DecodeError) -> ProtocolError {
        ProtocolError::Decode(e)
    }
}

/// Limits and credentials of a client connection.
#[derive(Clone)]
pub struct ClientConfig {
    /// The cluster's client token, sent in Hello.
    pub token: Vec<u8>,
    /// Largest frame sent or accepted, prefix included.
    pub frame_bytes_max: usize,
    /// Requests sent and not yet answered before `request` refuses more.
    pub in_flight_max: usize,
}

impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("frame_bytes_max", &self.frame_bytes_max)
            .field("in_flight_max", &self.in_flight_max)
            .finish_non_exhaustive()
    }
}

impl ClientConfig {
    /// A config sending `token`, with default limits (256 in flight).
    pub fn new(token: &[u8]) -> ClientConfig {
        ClientConfig {
            token: token.to_vec(),
            frame_bytes_max: FRAME_BYTES_MAX,
            in_flight_max: 256,
        }
    }
}

/// Why [`ClientSession::request`] did not produce a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// `in_flight_max` requests await answers; wait for one.
    InFlightFull,
    /// The server would reject the request (too large, too many items).
    Encode(EncodeError),
    /// The connection failed; open a new one.
    Closed,
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::InFlightFull => f.write_str("too many requests in flight"),
            RequestError::Encode(e) => write!(f, "request not sent: {e}"),
            RequestError::Closed => f.write_str("connection closed"),
        }
    }
}

impl std::error::Error for RequestError {}

/// What the client gets out of its session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Received {
    /// The answer to request `id`, of a kind that fits the request.
    Response {
        /// The request's id.
        id: u64,
        /// The answer (possibly an Error).
        resp: Response,
    },
    /// The server rejected the connection (an Error with id 0) and closes
    /// it; the requests in flight have unknown outcomes.
    ConnectionError {
        /// Why.
        code: ErrorCode,
        /// The server's diagnosis.
        message: String,
    },
}

/// The client end of one connection: numbers requests, matches answers.
#[derive(Debug)]
pub struct ClientSession {
    config: ClientConfig,
    framer: Framer,
    next_id: u64,
    /// Request id -> opcode, to check each answer fits its request.
    in_flight: BTreeMap<u64, u8>,
    node: Option<NodeId>,
    closed: bool,
    failed: Option<ProtocolError>,
    stats: SessionStats,
}

impl ClientSession {
    /// A session for a new connection; send [`hello`](Self::hello) first.
    pub fn new(config: ClientConfig) -> ClientSession {
        check_frame_bytes_max(config.frame_bytes_max);
        assert!(config.in_flight_max > 0, "in_flight_max is 0");
        assert!(
            config.token.len() <= TOKEN_BYTES_MAX,
            "token longer than TOKEN_BYTES_MAX"
        );
        ClientSession {
            framer: Framer::new(config.frame_bytes_max, config.frame_bytes_max),
            config,
            next_id: 1,
            in_flight: BTreeMap::new(),
            node: None,
            closed: false,
            failed: None,
            stats: SessionStats::default(),
        }
    }

    /// The Hello frame. Requests may follow at once (pipelined); the server
    /// serves them only if the Hello succeeds.
    pub fn hello(&mut self) -> Result<(u64, Vec<u8>), RequestError> {
        let req = Request::Hello {
            version: VERSION,
            token: self.config.token.clone(),
        };
        self.request(&req)
    }

    /// Encodes `req` with a fresh id; returns the id and the frame to write.
    pub fn request(&mut self, req: &Request) -> Result<(u64, Vec<u8>), RequestError> {
        if self.closed || self.failed.is_some() {
            return Err(RequestError::Closed);
        }
        if self.in_flight.len() >= self.config.in_flight_max {
            return Err(RequestError::InFlightFull);
        }
        let id = self.next_id;
        let mut out = Vec::new();
        encode_request(id, req, self.config.frame_bytes_max, &mut out)
            .map_err(RequestError::Encode)?;
        // Ids are never 0 (that id names the connection) and never reused
        // within a connection: 2^64 requests do not happen.
        self.next_id += 1;
        self.in_flight.insert(id, req.opcode());
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += out.len() as u64;
        Ok((id, out))
    }

    /// Takes bytes read from the socket; returns how many it took. Call
    /// [`poll`](Self::poll) until it yields nothing, then push the rest.
    pub fn push(&mut self, bytes: &[u8]) -> usize {
        if self.closed || self.failed.is_some() {
            self.stats.bytes_discarded += bytes.len() as u64;
            return bytes.len();
        }
        let n = self.framer.push(bytes);
        self.stats.bytes_received += n as u64;
        if let Err(e) = self.framer.check_head() {
            self.fail(e.into());
        }
        n
    }

    /// The next answer, `Ok(None)` if none is complete, or a fatal error:
    /// the server is broken or not a quire node; close the connection.
    pub fn poll(&mut self) -> Result<Option<Received>, ProtocolError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.closed {
            return Ok(None);
        }
        let frame = match self.framer.next_frame() {
            Ok(Some(frame)) => frame,
            Ok(None) => return Ok(None),
            Err(e) => return Err(self.fail(e.into())),
        };
        self.stats.frames_received += 1;
        let (id, resp) = match decode_response(&frame, self.config.frame_bytes_max) {
            Ok(r) => r,
            Err(e) => return Err(self.fail(e.into())),
        };
        if id == 0 {
            if let Response::Error { code, message, .. } = resp {
                self.closed = true;
                return Ok(Some(Received::ConnectionError { code, message }));
            }
        }
        match self.in_flight.get(&id) {
            Some(&op) if resp.answers(op) => {}
            _ => return Err(self.fail(ProtocolError::UnexpectedResponse { id })),
        }
        self.in_flight.remove(&id);
        if let Response::HelloOk { node } = resp {
            self.node = Some(node);
        }
        Ok(Some(Received::Response { id, resp }))
    }

    /// Ids of the requests still awaiting answers, in order; after the
    /// connection is lost, these have unknown outcomes (retry appends with
    /// the same client id and seq: the node applies them once).
    pub fn in_flight_ids(&self) -> Vec<u64> {
        self.in_flight.keys().copied().collect()
    }

    /// Number of requests awaiting answers.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The server's node id, once its HelloOk arrived.
    pub fn node(&self) -> Option<NodeId> {
        self.node
    }

    /// True after a fatal error or a connection error from the server.
    pub fn is_closed(&self) -> bool {
        self.closed || self.failed.is_some()
    }

    /// Bytes received and not yet decoded.
    pub fn buffered_bytes(&self) -> usize {
        self.framer.buffered()
    }

    /// This connection's counters.
    pub fn stats(&self) -> &SessionStats {
        &self.stats
    }

    fn fail(&mut self, e: ProtocolError) -> ProtocolError {
        self.stats.count_error(&e);
        self.failed = Some(e.clone());
        self.framer.clear();
        e
    }
}
