//! The client wire protocol, sans-IO: frames, messages and the per-connection
//! state machines of both ends.
//!
//! This module owns the bytes between a client and a node and nothing
//! else: it never touches a socket, a clock or a thread. The TCP server in
//! the daemon and the client library move bytes between their sockets and
//! a [`ServerSession`] or [`ClientSession`]; everything a peer can get
//! wrong is decided here, where it can be tested and fuzzed exhaustively.
//!
//! - [`wire`]: the frame layout, [`Request`], [`Response`] and
//!   [`ErrorCode`], with a total decoder.
//! - `framer`: the bounded buffer that cuts a stream into frames.
//! - [`session`]: the handshake, request ids, pipelining, limits and
//!   counters of one connection.

mod framer;
pub mod session;
pub mod wire;

pub use session::{
    ClientConfig, ClientSession, Incoming, ProtocolError, Received, RequestError, ServerConfig,
    ServerSession, SessionStats,
};
pub use wire::{DecodeError, EncodeError, Entry, ErrorCode, LeaderInfo, Request, Response};

#[cfg(test)]
mod tests;
